"""The torch-free scheduler: who runs together each step, and the KV blocks they hold (see scheduler.py)."""
from samebits.engine.scheduler.batch import ScheduledSeq, SchedulerOutput
from samebits.engine.scheduler.block_manager import BlockManager, IntegrityError
from samebits.engine.scheduler.scheduler import QueueFull, Scheduler

__all__ = ["BlockManager", "IntegrityError", "QueueFull", "ScheduledSeq", "Scheduler", "SchedulerOutput"]
