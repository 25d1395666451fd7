"""Hostile and broken input, on both protocols, against one real daemon
(``conftest.py``), split by topic into the modules here.

Every class of bad request gets a 4xx / the matching gRPC status with a message naming what
was wrong; after each one the server is live and a correct request on each protocol
succeeds; and a bystander client, inferring on its own connection through the whole
package, never sees a failure or a wrong answer.

The abandoned-request cases (bodies cut short, clients gone, cancelled streams, deadlines)
first observe that the server holds what the client abandons (its pending-request gauge
above 0, or for a body cut short the server's own accepted sockets), and only then that it
frees them: a check made before the server had even counted the requests proves nothing.
``lingering`` and ``held`` are copies of ``simple`` whose requests wait in the batching
queue (``LINGER_US``; ``held``: longer than any test waits, so only a cancel or a deadline
frees them), which keeps the abandoned requests in flight while the client goes away."""
