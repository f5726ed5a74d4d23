"""Discrete-event simulation of a training step (simpy) and of failures over a whole run."""

from .api import DP_PATTERNS, SimulationError, StepResult, simulate_plan, simulate_step
from .schedules import SCHEDULES, ScheduleError, Task, device_orders
from .step import SimEvent

__all__ = [
    "DP_PATTERNS",
    "SCHEDULES",
    "ScheduleError",
    "SimEvent",
    "SimulationError",
    "StepResult",
    "Task",
    "device_orders",
    "simulate_plan",
    "simulate_step",
]
