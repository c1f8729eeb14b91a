"""`reasonrl report`'s drawing: read run directories (``runs``), draw the papers' pictures
(``figures``: one function per figure, ``FIGURES`` in order), write PNGs and a self-contained
``report.html`` (``build``). matplotlib only, through its Agg canvas (no display needed)."""

from reasonrl.stage_package import callable_package

callable_package(__name__)  # reasonrl.report(...) is the Python API's report (reasonrl.api); the package stays a package

from reasonrl.report.build import Report, build_report  # noqa: E402
from reasonrl.report.figures import FIGURES, FigureSpec
from reasonrl.report.runs import Run, collect_runs

__all__ = ["FIGURES", "FigureSpec", "Report", "Run", "build_report", "collect_runs"]
