"""What-if sweeps: vary planner and cluster inputs, re-plan (or fix the plan), simulate
each point, and write the report (charts, points.json, index.html).

    from smplan.whatif import Question, parse_vary, run_whatif
    from smplan.report import write_report
    q = Question("examples/gpt.py:llama3_70b", hw="a100x8", tokens=1e12,
                 varies=(parse_vary("nodes=4,8,16"), parse_vary("hw=a100x8,h100x8")))
    write_report(run_whatif(q), "out/")
"""

from .grid import PointSpec, Vary, VaryError, grid, parse_vary
from .question import Question, QuestionError
from .sweep import recommend, run_whatif

__all__ = [
    "PointSpec",
    "Question",
    "QuestionError",
    "Vary",
    "VaryError",
    "grid",
    "parse_vary",
    "recommend",
    "run_whatif",
]
