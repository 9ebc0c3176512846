"""One of Kafka's Java tools running beside a test, read line by line, stopped when the test has
what it waited for.

A console consumer given ``--timeout-ms`` exits only after that long with nothing new: a test
that waits for its exit waits out the whole idle timeout after the last record (20 s in some).
``BackgroundTool`` collects the tool's stdout as it comes, lets the test wait for a condition on
the lines, then stops the tool at once; the idle timeout stays only as the tool's own bound.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from kproxy.embedded import KafkaCluster, tool_command
from kproxy.embedded.kafka import TOOL_JVM_ARGS

POLL_S = 0.05                 # how often ``wait_until`` re-checks the lines
STOP_TIMEOUT_S = 10.0         # a JVM given SIGTERM runs its shutdown hooks (a consumer leaves its group)


class BackgroundTool:
    """A Java tool as a process; ``lines()`` so far; ``stop()`` ends it and returns everything."""

    def __init__(self, target: KafkaCluster | str, main_class: str, *args: str,
                 jvm_args: Sequence[str] = TOOL_JVM_ARGS):
        self.command = tool_command(target, main_class, *args, jvm_args=jvm_args)
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        stdin=subprocess.DEVNULL, text=True)
        self._stderr: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(self.process.stdout, True), daemon=True),
                         threading.Thread(target=self._read, args=(self.process.stderr, False), daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, is_stdout: bool) -> None:
        for line in stream:
            with self._lock:
                (self._lines if is_stdout else self._stderr).append(line.rstrip("\n"))

    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)

    def stderr(self) -> str:
        with self._lock:
            return "\n".join(self._stderr)

    def wait_until(self, condition: Callable[[list[str]], Any], timeout: float, what: str) -> None:
        """Until ``condition(lines)`` holds; fail naming ``what`` if the tool exits or time runs out."""
        deadline = time.monotonic() + timeout
        while not condition(self.lines()):
            if self.process.poll() is not None:
                for reader in self._readers:
                    reader.join(STOP_TIMEOUT_S)
                if condition(self.lines()):
                    return
                raise AssertionError(f"the tool exited ({self.process.returncode}) before {what}:\n"
                                     f"{self.stderr()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g}s waiting for {what}:\n{self.stderr()[-3000:]}")
            time.sleep(POLL_S)

    def stop(self) -> list[str]:
        """Stop the tool (TERM, then KILL) and return every line it wrote."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for reader in self._readers:
            reader.join(STOP_TIMEOUT_S)
        return self.lines()

    def __enter__(self) -> BackgroundTool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()
