"""Reading checkpoints and run directories: where a checkpoint is (:mod:`.layout`), loading it (:mod:`.load`), and the
one-line readers of its files (:mod:`.files`). Below the trainers, which write checkpoints, and the rewards, the
evaluation and export, which load them.
"""
