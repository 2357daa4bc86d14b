"""NCCL: across GPUs and nodes, a two-rank process group per prefill-decode pair (gloo on CPU).

The decode worker runs a TCPStore and names it in its descriptor (host, port). On its first handoff to
a decode worker, a prefill worker opens a *link* to it: a process group of two ranks (0 = prefill,
1 = decode) under a fresh link name in that store; the decode worker joins when the first handoff
naming the link arrives. Each link has one thread per side that runs the link's transfers in order:
NCCL and gloo match point-to-point operations between two ranks in the order they are posted, and
both sides post them in `kv_handoff` record order (the data channel keeps that order).

A transfer is the blocks in destination order, cut into segments (`plan_segments`), then a small trailer
(sequence number, request id checksum, bytes, segment count). A segment whose ids are consecutive on a
side is sent from (received into) a view of that side's pool, however long; otherwise the sender gathers
a chunk of at most CHUNK_BYTES into a buffer and the receiver receives into one and scatters it into the
reserved blocks. Views are all posted at once (the NCCL stream runs them back to back); at most two
segments that hold a scratch buffer are in flight on each side, so a gather or scatter overlaps the next
message and scratch memory stays at two chunks. The thread that calls `receive` posts what needs no wait
itself, when the link has nothing earlier left to post; the link threads post the rest. Everything is posted on
the link's stream, behind nothing the worker's steps queued (`Link.on_stream` says why that is safe). The receiver
checks the trailer once everything has arrived: bytes of a link out of step could only have landed in
blocks reserved for this handoff, which then fails. (Traced on 2xH200: a header checked before posting
into the pool, and the receiving link thread's wake-up, held the bytes back ~0.4 ms a handoff.)

`send` and `receive` return at once with futures; the worker holds the request's blocks until they
resolve. A failed or timed-out operation breaks the link (its later transfers fail too, and the next
handoff opens a new link), so one lost peer costs the requests in flight to it, never a stuck worker.

`link.py`: a link, its thread, and how a transfer's operations are posted; `transport.py`: the transport.
"""
