"""jobctl.engine.checkpoint.store: where checkpoints live, on local disk or any fsspec URL.

``format`` is the one on-storage layout of every tier (step folders, part records, the
manifest written last as the commit marker, digests); ``local`` stages a step on local
disk and publishes it with one rename; ``checkpoint_store`` writes parts, commits,
finds, verifies, fetches and retains steps on a store (``file://``, S3, ...) and
``transfer`` moves many files at once with retries and progress.

Part of ``checkpoint``, in layer 4 of ``engine.LAYERS`` (with runtime, channel and
state): it may import the layers below (core to planner) and, without a cycle, the rest
of its own.
"""
