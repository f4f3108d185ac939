"""More test-only modes for the reliability tests (loaded next to fault_modes.py through
FUSEBENCH_PLUGINS="fault_modes.py,more_faults.py"). Each plants one fault."""
import ctypes
import os
import time

from fusebench.modes import register_mode
from fusebench.modes.base import Mode
from fusebench.modes.options import ModeOption


@register_mode
class SegfaultInCompile(Mode):
    """A real SIGSEGV (NULL read), but only while the model is being compiled (prepare) and only
    when the compile option says so: the compiler-crash shape."""
    name = "test_segv_compile"
    options = (ModeOption("compile_backend", default="inductor"),)

    def prepare(self, model, example_inputs, options, events):
        if self.opts(options)["compile_backend"] == "inductor":
            ctypes.string_at(0)                 # SIGSEGV
        return model


@register_mode
class AbortInCompile(Mode):
    """SIGABRT only in prepare (compile), never in the timed steps."""
    name = "test_abort_compile"

    def prepare(self, model, example_inputs, options, events):
        os.abort()


@register_mode
class IllegalMemoryAccess(Mode):
    """The CUDA error after which the device is gone: an OOM-looking message that must never be
    retried with a smaller batch."""
    name = "test_illegal_access"

    def prepare(self, model, example_inputs, options, events):
        raise RuntimeError("CUDA error: an illegal memory access was encountered "
                           "(out of memory?)")


@register_mode
class HangOnCall(Mode):
    """Prepares fine; every call hangs (a deadlocked kernel). Used for Ctrl-C and SIGKILL."""
    name = "test_hang_call"

    def prepare(self, model, example_inputs, options, events):
        def fn(x):
            time.sleep(3600)
        return fn


@register_mode
class RaisesInStep(Mode):
    """A compile that "succeeds" but whose graph raises on the first call: an error record."""
    name = "test_raise_step"

    def prepare(self, model, example_inputs, options, events):
        def fn(x):
            raise RuntimeError("planted: lowering failed for aten.convolution")
        return fn


@register_mode
class ScaledOutput(Mode):
    """Wrong from the first call: output scaled by 1.01 (a mismatch the repro must show)."""
    name = "test_wrong_output"

    def prepare(self, model, example_inputs, options, events):
        return lambda x: model(x) * 1.01


@register_mode
class HangAfterFive(Mode):
    """Five calls run (first call, warm-up, the first timed steps), then every call hangs: a
    cell killed by its timeout part-way through timing."""
    name = "test_hang_after_5"

    def prepare(self, model, example_inputs, options, events):
        calls = {"n": 0}

        def fn(*args):
            calls["n"] += 1
            if calls["n"] > 5:
                time.sleep(3600)
            return model(*args)
        return fn
