"""The learning machinery behind `reasonrl train` and `reasonrl pretrain-value`: collector, learner, batches, backends, checkpoints."""

from reasonrl.stage_package import callable_package

callable_package(__name__)  # reasonrl.train(...) is the Python API's train (reasonrl.api); the package stays a package
