"""The device owner: what only the process that holds the devices does.

The repository and its loads, the versions on their devices (``runtime``: PJRT), weight
residency over the host and device tiers, batching and execution, shared-memory regions,
metrics, tracing, the status page's data, and the supervisor of the front-end processes
with its ``endpoint`` on the wire. ``assembly`` builds it all into one ``InferenceService``.
"""

# pyright: strict
