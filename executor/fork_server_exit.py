"""Imported by the launcher's fork server only (launch.FORK_SERVER_PRELOAD), never by a launcher.

The server holds torch, dynamo and the trainer, imported for the ranks it forks. When the launch
ends, the launcher stops it and waits for it to exit (multiprocessing's ForkServer._stop): the
interpreter's teardown of those modules took 1.4 s of every launch (measured on 2 CPU cores, a
dp=2 run of examples/gpt.py:tiny). The server has nothing left to write or release by then (its
ranks have exited), so it leaves at once. A forked rank never runs this: it leaves through
os._exit after its function (multiprocessing's forkserver child).
"""

import atexit
import os

atexit.register(os._exit, 0)
