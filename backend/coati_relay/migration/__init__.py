"""What scripts written by ``coati-relay migrate`` and their readers use.

- `coati_relay.migration.from_legacy`: the legacy ``coati.ray`` settings in this engine's terms, the helpers every
  migrated script imports (``from coati_relay.migration.from_legacy import round_sizes, ...``);
- `coati_relay.migration.guide`: ``coati-relay docs [TOPIC]``, the migration guide that ships with the package (the
  command each NOTE of a migrated script ends in).

Both import nothing but the standard library, and so does this package: reading a migrated script stays cheap.
"""
