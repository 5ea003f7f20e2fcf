"""``python -m coati_compat.migrate LEGACY_SCRIPT.py [-o NEW_SCRIPT.py] [--yaml CONFIG.yaml]``."""
import sys

from coati_compat.migrate.cli import main

sys.exit(main())
