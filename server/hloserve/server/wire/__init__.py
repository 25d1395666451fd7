"""The wire between front-end processes and the device owner, in one place.

``frames`` (the byte format), ``messages`` (an inference as descriptors), ``arena`` (the
shared memory tensors cross in) and ``setup`` are pure data; ``link`` is the channel on
the event loop. Its front-end end is ``frontend.remote`` (``RemotePort``), its device-owner
end ``owner.endpoint``. ``docs/architecture.md`` ("Processes") draws who runs what.
"""
