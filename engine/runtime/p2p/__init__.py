"""jobctl.engine.runtime.p2p: point-to-point messages between pipeline neighbours.

``gloo``: torch.distributed sends and receives (and the process group's timeout);
``shm``: shared-memory rings between ranks on one machine.

Part of ``runtime``, in layer 4 of ``engine.LAYERS`` (with checkpoint, channel and
state): it may import the layers below (core to planner) and, without a cycle, the rest
of its own.
"""
