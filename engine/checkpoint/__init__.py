"""jobctl.engine.checkpoint: saving and finding training state.

Per-block snapshots and their files (``blocks``), one rank's background writer,
publisher and uploader (``manager``, ``upload``, ``inflight``), where a run resumes
(``resume``), Slurm requeue (``requeue``) and the survivors' emergency checkpoint of a
lost node (``emergency``), a run's weights in its model's own format (``export``:
a Hugging Face directory); the checkpoint store itself (local and remote, its format)
is ``store``.

In layer 4 of ``engine.LAYERS`` (with runtime, channel and state): it may import the
layers below (core to planner) and, without a cycle, the rest of its own.
"""
