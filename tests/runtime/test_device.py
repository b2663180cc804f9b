"""``host.runtime.device.Device``: the same device-level tests on every transport.

The ``device`` fixture gives a ``Device`` and the ``NpuModel`` behind it, over each
transport: ``model`` (in process) and ``pty`` (``SerialTransport`` through a
pseudo-terminal whose far end runs a ``ProtocolServer`` in a thread). Expected results
come from a twin ``NpuModel`` driven directly, or from ``host.compiler.programs``' own
``Program.run``.

The end-to-end LSTM test (100 sequences streamed) runs on those two and, with the first
``LSTM_SIM_JOBS`` (12) of them, on ``sim``, the simulated board
(``sim.board.SimTransport``: link and core under Verilator, marked ``sim``; it runs when
``--sim`` selects Verilator; 12 keep the regression's longest test short and still fill
the stream's window of 4 three times over). Its configuration is
``tests/hw/test_link_hw.py``'s, so both use one cached board build. Icarus (~65 cycles/s on
this board, against ~1,300 for Verilator) would need about 40 minutes for the 100
sequences, so the simulated board runs on Verilator only.
"""

import dataclasses

import numpy as np
import pytest

from host.spec import protocol as p
from host.spec.config import NpuConfig
from host.compiler.image import program_image
from host.runtime.device import Device, DeviceError, LinkError, StreamError
from host.spec.isa import ErrorCode, Instruction as I, Reg, Space, encode_program
from host.model.core import NpuModel
from host.compiler.programs import lstm_sequence, native
from host.spec.protocol import Opcode, Status
from host.runtime.server import ProtocolServer, PtyServer
from host.runtime.transport import ModelTransport, SerialTransport, Transport
from sim.board import SMALL_CONFIG

from test_protocol_server import mlp_network, random_mrf_words, random_vectors

#: Deep enough that writes, reads and programs need several frames.
DEV = NpuConfig(n=4, tiles=2, mrf_depth=256, ivrf_depth=2048, vrf_depth=64, netq_depth=1024,
                program_depth=1200, max_length=4, max_col_tiles=4)
TRANSPORTS = ["model", "pty"]


def open_device(kind, model, **kwargs):
    """``(Device, closer)`` over transport ``kind`` to ``model``."""
    if kind == "model":
        dev = Device(ModelTransport(model), **kwargs)
        return dev, dev.close
    board = PtyServer(ProtocolServer(model)).start()
    dev = Device(SerialTransport(board.port), **kwargs)

    def close():
        dev.close()
        board.stop()
    return dev, close


@pytest.fixture(params=TRANSPORTS)
def device(request):
    model = NpuModel(DEV)
    dev, close = open_device(request.param, model)
    yield dev, model
    close()


def load_mlp(dev, rng, steps=3):
    program, memories = mlp_network(dev.config, rng, steps)
    for space, addr, data in memories:
        dev.write(space, addr, data)
    dev.load_program(program)
    return program, memories


def mlp_twin(program, memories, config=DEV):
    twin = NpuModel(config)
    for space, addr, data in memories:
        twin.write(space, addr, data)
    twin.load_program(program)
    return twin


def twin_job(twin, x, outputs):
    twin.push_input(x)
    assert twin.run().ok
    return twin.pop_output(outputs)


# --- the model's interface, over the link -------------------------------------------------

def test_info_and_config(device):
    dev, model = device
    info = dev.info()
    assert info == {"protocol_version": p.PROTOCOL_VERSION, "max_payload": p.MAX_PAYLOAD,
                    **model.info()}
    assert dev.config == DEV


def test_write_read_across_frames(device):
    dev, model = device
    rng = np.random.default_rng(1)
    x = random_vectors(rng, 1500, DEV.n)                 # 3 WRITE frames, 3 READ frames
    dev.write(Space.IVRF, 7, x)
    assert (model.read(Space.IVRF, 7, 1500) == x).all()
    assert (dev.read(Space.IVRF, 7, 1500) == x).all()
    dev.write(Space.MULVRF1, 60, x[:4].view(np.float16))  # float16 goes as its bits
    assert (model.read(Space.MULVRF1, 60, 4) == x[:4]).all()
    words = random_mrf_words(rng, DEV.mrf_words, DEV)    # 2 frames of MRF words
    dev.write(Space.MRF, 0, words)
    assert model.read(Space.MRF, 0, DEV.mrf_words) == words
    assert dev.read(Space.MRF, 0, DEV.mrf_words) == words
    dev.write(Space.MRF, 3, words[9])                    # one int is one word
    assert dev.read(Space.MRF, 3, 1) == [words[9]]


def test_program_in_chunks(device):
    dev, model = device
    rng = np.random.default_rng(2)
    words = encode_program([I.s_wr(Reg.ITERATIONS, 2)] * 1100
                           + [I.v_rd(Space.IVRF, 0), I.v_wr(Space.NETQ), I.end_chain(),
                              I.end()])
    dev.write(Space.IVRF, 0, random_vectors(rng, 1, DEV.n))
    dev.load_program(words)
    result = dev.run()
    assert (result.instructions, result.chains, result.pc, result.error) == (
        1104, 2, 1103, ErrorCode.NONE)
    assert dev.output_level == 2 and dev.input_level == 0
    with pytest.raises(ValueError, match="non-empty 1-D array"):
        dev.load_program([])


def test_push_run_pop_counters_reset(device):
    dev, model = device
    rng = np.random.default_rng(3)
    program, memories = load_mlp(dev, rng)
    twin = mlp_twin(program, memories)
    for _ in range(3):
        x = random_vectors(rng, 6, DEV.n)
        dev.push_input(x)
        twin.push_input(x)
        got, want = dev.run(), twin.run()
        assert dataclasses.replace(got, message="") == want
        assert (dev.pop_output(6) == twin.pop_output(6)).all()
    assert dev.counters() == twin.counters()
    assert any(twin.counters().values())                 # NaN/inf inputs were counted
    dev.clear_counters()
    assert set(dev.counters().values()) == {0}
    dev.reset()
    assert dev.status() == {"error": ErrorCode.NONE, "busy": False, "input_level": 0,
                            "output_level": 0}
    assert not dev.read(Space.ASVRF0, 0, 2).any()


def test_refusals_say_what_was_wrong(device):
    dev, model = device
    with pytest.raises(DeviceError, match=r"WRITE IVRF\[2047:2049\] refused: BAD_ADDRESS") \
            as exc:
        dev.write(Space.IVRF, 2047, np.zeros((2, 4), np.uint16))
    assert exc.value.status is Status.BAD_ADDRESS and exc.value.opcode is Opcode.WRITE
    with pytest.raises(DeviceError, match="BAD_SPACE: no such memory space"):
        dev.read(Space.ASVRF3, 0, 1)
    with pytest.raises(DeviceError, match="QUEUE_EMPTY"):
        dev.pop_output(1)
    with pytest.raises(DeviceError, match="MRF_WORD") as exc:
        dev.write(Space.MRF, 0, [0xFF])                  # exponent code 255
    assert exc.value.error is ErrorCode.MRF_WORD
    with pytest.raises(ValueError, match=r"shape \(count >= 1, 4\)"):
        dev.write(Space.IVRF, 0, np.zeros((2, 5), np.uint16))
    with pytest.raises(TypeError, match="vectors must be a float16, float32 or float64 array"):
        dev.push_input(np.zeros((2, 4), np.int32))       # not silently taken as bits
    assert dev.error is ErrorCode.NONE


def test_run_failure_sets_the_flag_and_halts(device):
    dev, model = device
    load_mlp(dev, np.random.default_rng(4))
    dev.push_input(np.zeros((2, 4), np.uint16))          # the program needs 6
    with pytest.raises(DeviceError, match="QUEUE_UNDERFLOW at instruction 3") as exc:
        dev.run()
    assert exc.value.error is ErrorCode.QUEUE_UNDERFLOW and exc.value.details["pc"] == 3
    assert dev.error is ErrorCode.QUEUE_UNDERFLOW
    with pytest.raises(DeviceError, match="error flag is set"):
        dev.push_input(np.zeros((4, 4), np.uint16))
    dev.clear_error()
    dev.push_input(np.zeros((4, 4), np.uint16))
    assert dev.run().chains == 6


# --- streaming ------------------------------------------------------------------------------

@pytest.mark.parametrize("window", [1, 3, 8])
def test_stream_results_in_order_with_bounded_memory(device, window):
    dev, model = device
    rng = np.random.default_rng(5)
    program, memories = load_mlp(dev, rng)
    twin = mlp_twin(program, memories)
    jobs = [random_vectors(rng, 6, DEV.n) for _ in range(25)]
    taken = []

    def source():
        for x in jobs:
            taken.append(len(taken))
            yield x

    seen, results = [], []
    for y in dev.stream(source(), outputs=6, window=window, total=len(jobs),
                        progress=lambda done, total: seen.append((done, total))):
        results.append(y)
        # Never more than `window` jobs read ahead of the results handed out.
        assert len(taken) - len(results) <= window
    assert seen == [(i + 1, 25) for i in range(25)]
    for x, y in zip(jobs, results):
        assert (y == twin_job(twin, x, 6)).all()
    assert dev.status()["output_level"] == 0 and dev.status()["input_level"] == 0


def test_stream_error_mid_stream_loses_and_duplicates_nothing(device):
    dev, model = device
    rng = np.random.default_rng(6)
    program, memories = load_mlp(dev, rng)
    twin = mlp_twin(program, memories)
    jobs = [random_vectors(rng, 6, DEV.n) for _ in range(12)]
    jobs[7] = jobs[7][:4]                                # the run of job 7 will underflow
    results = []
    with pytest.raises(StreamError) as exc:
        for y in dev.stream(jobs, outputs=6, window=4):
            results.append(y)
    err = exc.value
    assert err.job == 7 and err.error is ErrorCode.QUEUE_UNDERFLOW
    assert err.in_flight == [8, 9, 10] and err.ran == []
    assert "job 7 failed" in str(err) and "jobs 0..6 delivered" in str(err)
    assert len(results) == 7
    for x, y in zip(jobs, results):
        assert (y == twin_job(twin, x, 6)).all()
    # Nothing of job 7 or later ran: job 7's 4 vectors wait in the queue, no output.
    assert dev.status() == {"error": ErrorCode.QUEUE_UNDERFLOW, "busy": False,
                            "input_level": 4, "output_level": 0}
    dev.reset()                                          # the link is clean afterwards
    assert dev.error is ErrorCode.NONE


def test_stream_stopped_early_leaves_the_link_clean(device):
    dev, model = device
    rng = np.random.default_rng(7)
    load_mlp(dev, rng)
    jobs = [random_vectors(rng, 6, DEV.n) for _ in range(10)]
    gen = dev.stream(jobs, outputs=6, window=4)
    for _ in range(2):
        next(gen)
    gen.close()                                          # jobs 2..5 were in flight
    assert dev.status()["output_level"] == 0             # their outputs popped, dropped
    assert dev.info()["n"] == DEV.n


def test_stream_bad_input_after_good_jobs(device):
    dev, model = device
    rng = np.random.default_rng(8)
    load_mlp(dev, rng)
    jobs = [random_vectors(rng, 6, DEV.n) for _ in range(5)] + [np.zeros((6, 3), np.uint16)]
    # A list is checked whole before anything is sent: nothing runs.
    before = dev.counters()
    with pytest.raises(ValueError, match=r"input of job 5 must be native vectors of shape"):
        next(dev.stream(jobs, outputs=6, window=8))
    assert dev.status()["input_level"] == 0 and dev.counters() == before
    # A lazy source is checked job by job: the jobs before the bad one are delivered.
    results = []
    with pytest.raises(ValueError, match="input of job 5"):
        for y in dev.stream(iter(jobs), outputs=6, window=8):
            results.append(y)
    assert len(results) == 5


def test_stream_refuses_jobs_of_another_size(device):
    dev, model = device
    rng = np.random.default_rng(9)
    load_mlp(dev, rng)
    jobs = [random_vectors(rng, 6, DEV.n) for _ in range(4)]
    jobs[2] = random_vectors(rng, 7, DEV.n)              # one vector too many
    before = dev.counters()
    with pytest.raises(ValueError, match="input of job 2 has 7 vectors; each job takes 6"):
        next(dev.stream(jobs, outputs=6, vectors=6))
    assert dev.status()["input_level"] == 0 and dev.counters() == before
    assert len(list(dev.stream(jobs[:2], outputs=6, vectors=6))) == 2


# --- the end-to-end LSTM test -------------------------------------------------------------

#: The link bench's build (``tests/hw/test_link_hw.py``), so the simulated board is built once.
LSTM_CFG = SMALL_CONFIG
LSTM_X, LSTM_H, LSTM_T, LSTM_JOBS = 12, 10, 3, 100
LSTM_SIM_JOBS = 12


@pytest.fixture(scope="module")
def lstm_case():
    """An LSTM program image, 100 input sequences and the reference outputs of each,
    from ``host.compiler.programs`` run directly on a fresh model per sequence."""
    rng = np.random.default_rng(20)
    weights = {}
    for g in "fioc":
        weights[f"W_{g}"] = (rng.standard_normal((LSTM_H, LSTM_X)) * 0.4).astype(np.float16)
        weights[f"U_{g}"] = (rng.standard_normal((LSTM_H, LSTM_H)) * 0.4).astype(np.float16)
        weights[f"b_{g}"] = (rng.standard_normal(LSTM_H) * 0.2).astype(np.float16)
    h0 = (rng.standard_normal(LSTM_H) * 0.5).astype(np.float16)
    c0 = (rng.standard_normal(LSTM_H) * 0.5).astype(np.float16)
    seqs = [(rng.standard_normal((LSTM_T, LSTM_X)) * 1.5).astype(np.float16)
            for _ in range(LSTM_JOBS)]
    reference = []
    for xs in seqs:
        result, out = lstm_sequence(LSTM_CFG, weights, xs, h0, c0).run(NpuModel(LSTM_CFG))
        assert result.ok
        reference.append(out)
    image = program_image(lstm_sequence(LSTM_CFG, weights, seqs[0], h0, c0))
    return image, [native(xs, LSTM_CFG.n) for xs in seqs], reference


def pytest_generate_tests(metafunc):
    """``lstm_kind``: the transports of the LSTM test, ``sim`` (Verilator) when ``--sim``
    selects Verilator."""
    if "lstm_kind" in metafunc.fixturenames:
        kinds = list(TRANSPORTS)
        if metafunc.config.getoption("--sim") in ("all", "verilator"):
            kinds.append(pytest.param("sim", marks=pytest.mark.sim))
        metafunc.parametrize("lstm_kind", kinds)


def test_lstm_stream_matches_the_program_reference(lstm_kind, lstm_case, tmp_path):
    image, inputs, reference = lstm_case
    if lstm_kind == "sim":
        inputs, reference = inputs[:LSTM_SIM_JOBS], reference[:LSTM_SIM_JOBS]
        from sim.board import SimTransport
        dev = Device(SimTransport(LSTM_CFG, simulator="verilator"), timeout=120.0)
        close = dev.close
    else:
        dev, close = open_device(lstm_kind, NpuModel(LSTM_CFG))
    try:
        dev.load_image(image)
        dev.clear_counters()
        results = list(dev.stream(inputs, outputs=image.outputs, window=4,
                                  prologue=image.job_memories))
        counters = dev.counters()
    finally:
        close()
    assert len(results) == len(inputs)
    if lstm_kind == "sim":
        # The same jobs through the image exported as NumPy (docs/export.md), run in an
        # interpreter that cannot import the project: the simulated board's bits and
        # counters.
        from host.compiler.export import export_image
        from tests.compiler.test_export import _run_isolated
        py, _ = export_image(image, tmp_path / "lstm_layer.py")
        case = {"py": str(py), "inputs": np.array(inputs, np.uint16)}
        out, exported = _run_isolated(tmp_path, {"lstm": case})["lstm"]
        assert np.array_equal(out, np.array(results)) and exported == counters
    for i, (got, want) in enumerate(zip(results, reference)):
        assert got.dtype == np.uint16 and got.shape == want.shape
        assert (got == want).all(), f"sequence {i}"
    # The outputs really vary with the inputs and are finite FP16.
    assert len({r.tobytes() for r in results}) == len(inputs)
    assert not np.isnan(np.stack(results).view(np.float16)).any()


# --- link failures (model transport with faults injected) ---------------------------------

class Faulty(Transport):
    """A ModelTransport with faults: drop or damage bytes going either way."""

    def __init__(self, model, *, drop_sends=0, damage_send=None, damage_reply=None,
                 drop_replies=0):
        self.inner = ModelTransport(model)
        self.name = "faulty"
        self.drop_sends = drop_sends
        self.damage_send = damage_send      # index of the send whose byte 12 is flipped
        self.damage_reply = damage_reply
        self.drop_replies = drop_replies    # whole replies swallowed
        self.sends = 0
        self.replies = 0

    def send(self, data):
        self.sends += 1
        if self.drop_sends:
            self.drop_sends -= 1
            return
        if self.sends == self.damage_send:
            data = bytearray(data)
            data[-1] ^= 1                   # the payload CRC
        self.inner.send(bytes(data))

    def recv(self, n, timeout):
        data = self.inner.recv(65536, timeout)
        if data and self.drop_replies:
            self.drop_replies -= 1
            size = p.HEADER_BYTES + int.from_bytes(data[4:6], "little") + p.TRAILER_BYTES
            data = data[size:]
        if data and self.damage_reply is not None:
            self.replies += 1
            if self.replies == self.damage_reply:
                data = bytearray(data)
                data[p.HEADER_BYTES] ^= 0x40
                data = bytes(data)
        return data

    def close(self):
        self.inner.close()


def test_no_reply_is_a_link_error_then_the_link_recovers():
    model = NpuModel(DEV)
    dev = Device(Faulty(model, drop_sends=1), timeout=0.05)
    with pytest.raises(LinkError, match=r"no reply to INFO within 0.05 s from faulty"):
        dev.info()
    assert dev.info()["n"] == DEV.n


def test_corrupted_request_is_sent_again():
    model = NpuModel(DEV)
    dev = Device(Faulty(model, damage_send=2), retries=1)
    dev.info()
    dev.write(Space.IVRF, 0, np.ones((1, 4), np.uint16))     # send 2 damaged, send 3 good
    assert (model.read(Space.IVRF, 0, 1) == 1).all()
    dev = Device(Faulty(NpuModel(DEV), damage_send=2), retries=0)
    dev.info()
    with pytest.raises(DeviceError, match="BAD_CRC: the request arrived corrupted"):
        dev.clear_counters()


def test_damaged_and_lost_replies():
    dev = Device(Faulty(NpuModel(DEV), damage_reply=1))
    with pytest.raises(LinkError, match="arrived damaged"):
        dev.info()
    assert dev.info()["n"] == DEV.n
    dev = Device(Faulty(NpuModel(DEV)))
    dev.info()
    dev.transport.drop_replies = 1
    with pytest.raises(LinkError, match="lost on the link"):
        dev.read(Space.IVRF, 0, 1500)                    # 3 frames pipelined, first lost
    assert dev.status()["error"] is ErrorCode.NONE


def test_parameters_are_validated():
    transport = ModelTransport(NpuModel(DEV))
    with pytest.raises(ValueError, match="window must be from 1 to 64, not 0"):
        Device(transport, window=0)
    with pytest.raises(ValueError, match="timeout must be positive"):
        Device(transport, timeout=0)
    with pytest.raises(ValueError, match="retries must be from 0 to 10"):
        Device(transport, retries=11)
    dev = Device(transport)
    with pytest.raises(ValueError, match="outputs must be at least 1"):
        next(dev.stream([], outputs=0))
