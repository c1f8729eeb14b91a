"""The learning machinery behind `reasonrl train` and `reasonrl pretrain-value`: collector, learner, batches, backends, checkpoints."""
