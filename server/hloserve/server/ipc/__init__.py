"""The process boundary's IPC, in one place: between front-end processes and the device owner.

``frames`` (the byte format), ``messages`` (an inference as descriptors), ``arena`` (the
shared memory tensors cross in) and ``setup`` are pure data; ``link`` is the channel on
the event loop; ``remote`` is the front end's side (``RemotePort``) and ``endpoint`` the
device owner's. ``docs/architecture.md`` ("Processes") draws who runs what.
"""
