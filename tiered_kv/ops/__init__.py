"""Operations: the ``tiered-kv`` command line, the replay, capacity planning, store inspection,
Prometheus metrics and the benchmark helpers.

These modules sit on top of the library (they build hierarchies and drive them) and nothing in
the data model, the transfers or the hierarchy imports them. The config file's typed models live in
``tiered_kv.config``, a documented subpackage of their own.
"""
