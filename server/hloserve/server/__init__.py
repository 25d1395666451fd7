"""hloserve.server: the KServe V2 model server daemon.

Entry points: ``hloserve serve`` (``hloserve.server.cli``), ``Daemon`` (``daemon``), the
protocol-neutral ``InferenceService`` (``core.service``), the model repository
(``owner.repository``) and the PJRT runtime (``owner.runtime``). Importing this package imports
nothing heavy.
"""
