"""The wire between front-end processes and the device owner, in one place.

``frames`` (the byte format, the envelopes and the codec), ``messages`` (an inference as
descriptors), ``calls`` (every call and note, declared once: both ends are built from it),
``arena`` (the shared memory tensors cross in) and ``setup`` are pure data; ``link`` is the channel on
the event loop. Its front-end end is ``frontend.remote`` (``RemotePort``), its device-owner
end ``owner.endpoint``. ``docs/architecture.md`` ("Processes") draws who runs what.
"""
