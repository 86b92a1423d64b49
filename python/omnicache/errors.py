"""Exceptions: one class per error code of the library (internal/capi/omnicache.h),
each naming the Go sentinel it mirrors, and the package's own argument and
loading errors, all under OmnicacheError."""


class OmnicacheError(Exception):
    """Base of every error the library returns. ``code`` is the ABI's
    stable error code."""

    code = None

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code


def _cls(name, code, doc, bases=(OmnicacheError,)):
    return type(name, bases, {"code": code, "__doc__": doc, "__module__": __name__})


ConfigError = _cls("ConfigError", 1, "ErrConfig: a bad config.", (OmnicacheError, ValueError))
ClosedError = _cls("ClosedError", 2, "ErrClosed: the cache was closed.")
SequenceError = _cls("SequenceError", 3, "ErrSequence: the engine contract's order was broken.")
PlanError = _cls("PlanError", 4, "ErrPlan: the step plan is inconsistent.", (OmnicacheError, ValueError))
UnalignedHitError = _cls("UnalignedHitError", 5, "ErrUnalignedHit: a hit is not block aligned.", (OmnicacheError, ValueError))
HitBlocksError = _cls("HitBlocksError", 6, "ErrHitBlocks: a hit without its block ids.", (OmnicacheError, ValueError))
TokenCountError = _cls("TokenCountError", 7, "ErrTokenCount: outputs' tokens differ from the plan's.", (OmnicacheError, ValueError))
OutputsError = _cls("OutputsError", 8, "ErrOutputs: the outputs do not fit the begun step (the message names how: a tensor too small, a required key omitted, a tensor or accepted count that does not match, nil outputs).", (OmnicacheError, ValueError))
StepTooLargeError = _cls("StepTooLargeError", 9, "ErrStepTooLarge: a step larger than a staging page.")
UnknownStepError = _cls("UnknownStepError", 11, "ErrUnknownStep: a step id never saved or already consumed.")
NotInStepError = _cls("NotInStepError", 12, "ErrNotInStep: a request the step did not save.")
AbsentRequiredError = _cls("AbsentRequiredError", 13, "ErrAbsentRequired: a hit over absent rows of a required key.")
ReassignedError = _cls("ReassignedError", 14, "ErrReassigned: the hit's slots were reassigned before the read.")
BudgetError = _cls("BudgetError", 15, "ErrBudget: a device reservation cannot be met.")
WriteFailedError = _cls("WriteFailedError", 16, "ErrWriteFailed: a write failed (sticky).")
DeviceTimeoutError = _cls("DeviceTimeoutError", 17, "ErrDeviceTimeout: device work did not complete in time.")
TierMissError = _cls("TierMissError", 18, "ErrTierMiss (tier.ErrMiss): a tier block was not held or not imported.")
TierUnavailableError = _cls("TierUnavailableError", 19, "tier.ErrUnavailable: the tier's backend cannot be reached.")
TierAuthError = _cls("TierAuthError", 20, "tier.ErrAuth: the tier's backend refused the credentials.")
TierConfigError = _cls("TierConfigError", 21, "tier.ErrConfig: a bad tier spec or namespace.", (OmnicacheError, ValueError))
TierClosedError = _cls("TierClosedError", 22, "tier.ErrClosed: the tier was closed.")
ResetError = _cls("ResetError", 23, "ErrReset: the step was saved before a reset dropped its rows.")
TierCircuitOpenError = _cls("TierCircuitOpenError", 24, "tier.ErrCircuitOpen: the tier's store timed out; tier calls fail at once until it answers.")
NotPublishedError = _cls("NotPublishedError", 25, "ErrNotPublished: a block wait_published waited for was not stored in the tier.")
ArgumentError = _cls("ArgumentError", 100, "A bad argument at the C ABI (NULL pointer, negative length, bad flag).", (OmnicacheError, ValueError))
BadHandleError = _cls("BadHandleError", 101, "No such cache handle.")
ShortBufferError = _cls("ShortBufferError", 102, "Result buffers too small (nothing consumed: ask again with the sizes given).")
ForkedError = _cls("ForkedError", 103, "Called in a process forked after the library was loaded.")
PanicError = _cls("PanicError", 104, "A panic inside the library (a bug).")
UnsupportedError = _cls("UnsupportedError", 105, "Not supported by this build (e.g. CUDA tensors).")
InternalError = _cls("InternalError", 106, "An error with no code of its own.")
NoDeviceError = _cls("NoDeviceError", 107, "gpu.ErrNoDevice: no such CUDA device (no GPU, no driver, or the ordinal).")
WaitTimeoutError = _cls("WaitTimeoutError", 108, "A call's own timeout ran out (wait_published: blocks still being stored).",
                        (OmnicacheError, TimeoutError))


# Errors of the package itself, before a call reaches the library: each is
# also the built-in exception the same mistake raised before it had a class
# of its own (TypeError, KeyError, ImportError).
ArgumentTypeError = _cls("ArgumentTypeError", 100, "A bad argument's type or dtype: an ArgumentError and a TypeError.",
                         (ArgumentError, TypeError))
UnknownKeyError = _cls("UnknownKeyError", 100, "No key of that name in the cache: an ArgumentError and a KeyError.",
                       (ArgumentError, KeyError))
KeyLayoutError = _cls("KeyLayoutError", 8, "A key's tensor of another dtype or row shape than the first one saved for "
                      "that key (its rows would read back as the first's): an OutputsError and a TypeError.",
                      (OutputsError, TypeError))


class LoadError(OmnicacheError, ImportError):
    """The library could not be loaded: not built (make python), of another
    ABI, or a library it needs is missing (a cuda build needs the NVIDIA
    driver's libcuda.so.1). The message says which, and the OS's words."""

    def __init__(self, message, code=None):
        OmnicacheError.__init__(self, message, code)
        ImportError.__init__(self, message)


class StagingTimeoutError(OmnicacheError):
    """ErrStagingTimeout: no staging page became free in time.
    ``unconsumed`` lists the saved step ids not yet consumed (in save
    order), as the library handed them over (omnicache_last_error_steps,
    every one of them): consume them to free the pages."""

    code = 10

    def __init__(self, message, code=None, unconsumed=()):
        super().__init__(message, code)
        self.unconsumed = list(unconsumed)


ERRORS = {c.code: c for c in [
    ConfigError, ClosedError, SequenceError, PlanError, UnalignedHitError, HitBlocksError,
    TokenCountError, OutputsError, StepTooLargeError, StagingTimeoutError, UnknownStepError,
    NotInStepError, AbsentRequiredError, ReassignedError, BudgetError, WriteFailedError,
    DeviceTimeoutError, TierMissError, TierUnavailableError, TierAuthError, TierConfigError,
    TierClosedError, ResetError, TierCircuitOpenError, NotPublishedError, ArgumentError, BadHandleError, ShortBufferError, ForkedError, PanicError,
    UnsupportedError, InternalError, NoDeviceError, WaitTimeoutError]}


def error(code, message, steps=()):
    """The exception for a library error code; steps are the step ids the
    library named with it (StagingTimeoutError.unconsumed)."""
    cls = ERRORS.get(code)
    if cls is None:
        return InternalError("omnicache: unknown error code %d: %s" % (code, message), code)
    if cls is StagingTimeoutError:
        return cls(message, code, steps)
    return cls(message, code)
