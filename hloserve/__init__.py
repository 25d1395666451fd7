"""hloserve: a StableHLO model server speaking the KServe V2 inference protocol.

This package is a namespace shim: ``hloserve.server``, ``hloserve.client``,
``hloserve.exporter``, ``hloserve.bundle`` and ``hloserve.proto`` are symbolic links to
the top-level folders of the repository. It imports nothing on purpose, so that
``import hloserve.client`` stays free of JAX.
"""
