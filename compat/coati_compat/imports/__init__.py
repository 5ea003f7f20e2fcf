"""The import machinery: the finder of the legacy ``coati`` paths, the deprecation table, the ``.pth`` start-up
(`startup`, written by `install_pth`), patches run after a module's import, and the legacy-names switch.

Cheap on purpose (no torch): the ``.pth`` line imports this package in every interpreter.
"""
