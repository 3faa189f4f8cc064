"""Calling an RPC with a fuzzed request, and what every answer must satisfy."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Final

import grpc
import pytest
from google.protobuf import text_format
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from tests.fuzz.hostile import EXAMPLES, S
from tests.status import error_details

#: A unary call that takes longer than this is a hang, not an answer.
CALL_TIMEOUT_S: Final = 15.0
#: WatchEvents: how long to wait for the first message of the stream.
WATCH_TIMEOUT_S: Final = 0.2

#: The codes the services' domain errors map to: clear answers a client can act on.
CLEAR_CODES: Final = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.ABORTED,
    }
)

FUZZ_SETTINGS: Final = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # no example database: each run explores afresh; failures print the request
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)


def backend_of(url: str) -> str:
    return "postgres" if url.startswith(("postgresql://", "postgres://")) else "sqlite"


def strings_in(message: Message) -> list[tuple[str, str]]:
    """(field name, value) of every string set in a message, nested ones too."""
    found: list[tuple[str, str]] = []
    for descriptor, value in message.ListFields():
        entry = descriptor.message_type
        if entry is not None and entry.GetOptions().map_entry:
            values = [part for pair in value.items() for part in pair]
        else:
            values = value if descriptor.is_repeated else [value]
        for item in values:
            if isinstance(item, str):
                found.append((descriptor.name, item))
            elif isinstance(item, Message):
                found += strings_in(item)
    return found


def _short(value: str) -> str:
    if len(value) <= 120:
        return value
    return f"{value[:40]}...<{len(value)} characters: {sorted(set(value))[:8]!r}>"


def shortened(request: Message) -> Message:
    """A copy with every long string cut (for display only)."""
    copy = type(request)()
    copy.CopyFrom(request)
    for descriptor, value in copy.ListFields():
        if descriptor.message_type is not None and descriptor.message_type.GetOptions().map_entry:
            entries = dict(value)
            value.clear()
            for key, item in list(entries.items())[:20]:
                if isinstance(item, Message):
                    value[_short(key)].CopyFrom(shortened(item))
                else:
                    value[_short(key)] = _short(item) if isinstance(item, str) else item
        elif descriptor.is_repeated:
            items = list(value)
            del value[:]
            if descriptor.type == descriptor.TYPE_STRING:
                value.extend(_short(item) for item in items)
            elif descriptor.type == descriptor.TYPE_MESSAGE:
                value.extend(shortened(item) for item in items)
            else:
                value.extend(items)
        elif descriptor.type == descriptor.TYPE_STRING:
            setattr(copy, descriptor.name, _short(value))
        elif descriptor.type == descriptor.TYPE_MESSAGE:
            getattr(copy, descriptor.name).CopyFrom(shortened(value))
    return copy


def describe(request: Message, limit: int = 2000) -> str:
    """A request in one line, long strings cut, for assertion messages."""
    shown = text_format.MessageToString(shortened(request), as_one_line=True, as_utf8=True)
    shown = f"{type(request).__name__}({shown})"
    return shown if len(shown) <= limit else f"{shown[:limit]}... ({len(shown)} characters)"


class Fuzzed:
    """A fuzzed request; its repr (in Hypothesis' failure reports) cuts long strings."""

    def __init__(self, message: Message) -> None:
        self.message = message

    def __repr__(self) -> str:
        return describe(self.message)


@dataclass
class Answer:
    """One call's outcome: a response (for a stream: its first message, if any) or an error."""

    response: Message | None = None
    error: grpc.RpcError | None = None
    streaming: bool = False


class CarriedError(grpc.RpcError):
    """A call's error as CallStream answered it, read like the unary call's: its code,
    message and google.rpc.Status (as the unary call's grpc-status-details-bin)."""

    def __init__(self, status: Any) -> None:
        super().__init__(status.message)
        self._status = status

    def code(self) -> grpc.StatusCode:
        return next(c for c in grpc.StatusCode if c.value[0] == self._status.code)

    def details(self) -> str:
        return str(self._status.message)

    def trailing_metadata(self) -> Any:
        return (("grpc-status-details-bin", self._status.SerializeToString()),)


def carried(carrier: Callable[..., Any], request: Message) -> Answer:
    """One call over a CallStream (`request`: a CallStreamRequest): its answer's
    response, or its error as the unary call would have raised it."""
    try:
        (answer,) = carrier(iter([request]), timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as error:
        return Answer(error=error)
    kind = answer.WhichOneof("result")
    if kind == "error":
        return Answer(error=CarriedError(answer.error))
    return Answer(response=getattr(answer, kind))


def carried_calls(request_class: Any, service: Any, requests: Any, seed: Any) -> S[Message]:
    """CallStream requests (`request_class`): each call the stream carries, with its
    RPC's fuzzed requests (`requests[rpc](seed)`), or none; answered as the unary
    calls are checked (`carried`)."""
    rpc_of = {method.input_type.full_name: method.name for method in service.methods}
    calls = [
        st.builds(
            lambda carried, name=field.name: request_class(**{name: carried}),
            requests[rpc_of[field.message_type.full_name]](seed),
        )
        for field in request_class.DESCRIPTOR.oneofs_by_name["call"].fields
    ]
    return st.one_of(*calls, st.just(request_class()))


def call(stub: Any, method: MethodDescriptor, request: Message) -> Answer:
    rpc: Callable[..., Any] = getattr(stub, method.name)
    if method.client_streaming:
        return carried(rpc, request)
    streaming = method.server_streaming
    try:
        if not streaming:
            return Answer(response=rpc(request, timeout=CALL_TIMEOUT_S))
        stream = rpc(request, timeout=WATCH_TIMEOUT_S)
        try:
            return Answer(response=next(stream), streaming=True)
        except StopIteration:
            return Answer(streaming=True)
        finally:
            stream.cancel()
    except grpc.RpcError as error:
        return Answer(error=error, streaming=streaming)


def idle_stream(answer: Answer) -> bool:
    """A stream that sent nothing before the client's short deadline ended it."""
    return (
        answer.streaming
        and answer.error is not None
        and answer.error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    )


def check_answer(rpc: str, request: Message, answer: Answer) -> None:
    """Success, or a clear code with a google.rpc.ErrorInfo (and, for
    INVALID_ARGUMENT, a BadRequest naming the field): never UNKNOWN, INTERNAL or
    DEADLINE_EXCEEDED, except that a stream may end at the client's deadline."""
    error = answer.error
    if error is None:
        return
    if idle_stream(answer):
        # WatchEvents: DEADLINE_EXCEEDED is fine here. A live stream with nothing to
        # send yet is ended by the client's own short deadline (WATCH_TIMEOUT_S); a
        # refused request is answered at once, before any deadline.
        return
    code = error.code()
    assert code in CLEAR_CODES, (
        f"{rpc} answered {code.name}: {error.details()!r}\nrequest: {describe(request)}"
    )
    info, fields = error_details(error)
    assert info.reason, f"{rpc} {code.name} without an ErrorInfo reason: {describe(request)}"
    assert info.domain == "switchboard", f"{rpc} ErrorInfo domain {info.domain!r}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        assert fields and all(fields), (
            f"{rpc} INVALID_ARGUMENT without a BadRequest field ({fields}): {describe(request)}"
        )


# -- known server bugs ----------------------------------------------------------------------


@dataclass(frozen=True)
class KnownBug:
    """A server bug the fuzzer found. While open, requests it matches are left out of
    the fuzz runs (so the suite stays green) and `repro` shows it as a strict xfail;
    once fixed, `repro` is a regression test and the fuzz runs leave nothing out."""

    name: str
    rpc: str
    #: What went wrong and what is expected instead.
    reason: str
    #: The backends on which `repro` showed the bug.
    backends: tuple[str, ...]
    #: Whether the bug is fixed.
    fixed: bool
    #: Whether a fuzzed request (on a backend) hits this bug, known from the request.
    matches: Callable[[str, Message, str], bool] | None
    #: The minimal reproducing request, given the seeded state.
    repro: Callable[[Any], Message]
    #: The expected answer, beyond the general contract: a status code, if any.
    expected: grpc.StatusCode | None = None
    #: Extra RPCs the same bug reaches (for `matches` and `shows`).
    also: Sequence[str] = field(default=())
    #: Whether an answer shows this bug, for bugs known by their answer (any RPC in
    #: `also`, or every RPC when `also` is "*").
    shows: Callable[[Answer], bool] | None = None

    def reaches(self, rpc: str) -> bool:
        return rpc == self.rpc or rpc in self.also or "*" in self.also


def known_bug(bugs: Sequence[KnownBug], rpc: str, request: Message, backend: str) -> str | None:
    """The known bug a request would hit, judged from the request."""
    for bug in bugs:
        if (
            not bug.fixed
            and bug.matches is not None
            and bug.reaches(rpc)
            and bug.matches(rpc, request, backend)
        ):
            return bug.name
    return None


def known_answer(bugs: Sequence[KnownBug], rpc: str, answer: Answer) -> str | None:
    """The known bug an answer shows, judged from the answer."""
    for bug in bugs:
        if not bug.fixed and bug.shows is not None and bug.reaches(rpc) and bug.shows(answer):
            return bug.name
    return None


def mark_if_open(bug: KnownBug, backend: str, request: pytest.FixtureRequest) -> None:
    """A strict xfail while the bug is open and shows on this backend; a regression
    test once it is fixed."""
    if not bug.fixed and backend in bug.backends:
        request.applymarker(pytest.mark.xfail(strict=True, reason=bug.reason))


def check_request_table(requests: Collection[str], service: Any, named: AbstractSet[str]) -> None:
    """A new RPC cannot go unfuzzed: the table covers the service descriptor exactly,
    and every RPC named elsewhere (read-only sets, bugs) is one."""
    assert set(requests) == set(service.methods_by_name)
    assert not named - set(requests), f"not RPCs: {sorted(named - set(requests))}"


def check_repro(bug: KnownBug, stub: Any, method: MethodDescriptor, request: Message) -> None:
    answer = call(stub, method, request)
    check_answer(bug.rpc, request, answer)
    if bug.expected is not None:
        got = "OK" if answer.error is None else answer.error.code().name
        assert answer.error is not None and answer.error.code() == bug.expected, (
            f"{bug.rpc} answered {got}, expected {bug.expected.name}: {describe(request)}"
        )


def fuzz_rpc(
    stub: Any,
    rpc: str,
    method: Any,
    strategy: Any,
    *,
    bugs: Sequence[KnownBug],
    backend: str,
    read_only: Collection[str],
    snapshot: Callable[[], Any],
    nothing_written: Callable[[str, Message, Answer, Any, Any], None],
    accepted_problems: Callable[[str, Message], list[str]],
) -> None:
    """Fuzzes one RPC: every answer is clear, and a rejection (or a read) writes nothing."""

    @FUZZ_SETTINGS
    @given(fuzzed=strategy.map(Fuzzed))
    def fuzz(fuzzed: Fuzzed) -> None:
        sent = fuzzed.message
        if known_bug(bugs, rpc, sent, backend) is not None:
            reject()  # shown by test_known_bug instead
        before = snapshot()
        answer = call(stub, method, sent)
        if answer.error is not None or rpc in read_only:
            nothing_written(rpc, sent, answer, before, snapshot())
        if known_answer(bugs, rpc, answer) is not None:
            return  # shown by test_known_bug instead
        check_answer(rpc, sent, answer)
        if answer.response is not None:
            assert not accepted_problems(rpc, answer.response), describe(sent)

    fuzz()
