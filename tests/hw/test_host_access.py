"""The core's host access alone (``hw.core.host_access.HostAccess``) in Amaranth's
simulator: random host requests (good ones and every kind of refusal, one at a time as
the link sends them) with random offers, stalls on every output stream and stretches
with a program running (``open`` low), compared in order with a plain Python account
of what ``docs/npu.md`` section 1 says: what reaches the memories, the MVM and the
program memory, the error codes, the read responses and the program's length. At one
beat a vector and at four.

The whole core, with host access in it, is ``tests/hw/test_npu_hw.py``; the link drives
it in ``tests/hw/test_link_hw.py``.
"""

import random

import pytest

from host.spec.isa import ErrorCode, Space, vector_spaces
from hw.core.decode import KEPT_FIELDS
from hw.core.host_access import (
    HostAccess,
    program_write_layout,
    vector_read_layout,
    vector_write_layout,
)
from hw.core.reader import RD_DATA_LATENCY
from hw.mvm.mvm import mrf_address_layout, mrf_word_layout, weight_row_layout
from tests.hw.test_feeder_writer import BUILDS, beats_of, run
from tests.hw.test_npu_hw import ALL_BUILDS
from tests.hw.test_word_check import kept_fields

KINDS = ("vec_w", "vec_r", "mrf_w", "w_rows", "mrf_r", "prog_w")
#: The request port of each kind.
PORTS = {"vec_w": "vec_w", "vec_r": "vec_r_req", "mrf_w": "mrf_w", "w_rows": "w_rows",
         "mrf_r": "mrf_r_req", "prog_w": "prog_w"}


def pack(layout, **fields):
    """The bits of a payload of ``layout`` with ``fields`` (ints), the rest zero."""
    value = 0
    for name, field_value in fields.items():
        field = layout[name]
        value |= (int(field_value) & ((1 << field.width) - 1)) << field.offset
    return value


def random_request(rng, config):
    """One request: ``(kind, payload bits, fields)``. About half are refused."""
    kind = rng.choice(KINDS)
    mvm = config.mvm
    if kind in ("vec_w", "vec_r"):
        space = rng.choice([s.value for s in vector_spaces(config)] + list(range(16)))
        depth = config.ivrf_depth if space == Space.IVRF.value else config.vrf_depth
        addr = rng.choice([rng.randrange(depth), rng.randrange(depth), depth - 1, depth,
                           rng.randrange(1 << 24)])
        if kind == "vec_w":
            values = rng.getrandbits(16 * config.n)
            return kind, pack(vector_write_layout(config), space=space, addr=addr,
                              values=values), {"space": space, "addr": addr,
                                               "values": values}
        return kind, pack(vector_read_layout(config), space=space, addr=addr), {
            "space": space, "addr": addr}
    # An engine at or beyond T where the field can hold one (ADDRESS_RANGE).
    engines = 1 << mrf_address_layout(mvm)["engine"].width
    engine = rng.choice([rng.randrange(config.tiles)] * 3 + [rng.randrange(engines)])
    address = {"engine": engine, "row": rng.randrange(config.n),
               "slot": rng.randrange(config.mrf_depth)}
    if kind == "mrf_w":
        exponent = rng.choice([0, 127, 142, 143, 255, rng.randrange(143)])
        block = exponent | rng.getrandbits(config.n * config.mantissa_bits_w) << 8
        fields = dict(address, block=block)
        return kind, pack(mrf_word_layout(mvm), **fields), dict(fields, exponent=exponent)
    if kind == "w_rows":
        static = rng.randrange(2)
        exponent = rng.choice([0, 142, 143, 255])
        fields = dict(address, values=rng.getrandbits(16 * config.n),
                      rounding=rng.randrange(2), static=static, static_exponent=exponent)
        return kind, pack(weight_row_layout(mvm), **fields), fields
    if kind == "mrf_r":
        return kind, pack(mrf_address_layout(mvm), **address), address
    addr = rng.choice([0, 0, rng.randrange(config.program_depth),
                       config.program_depth - 1, config.program_depth,
                       rng.randrange(1 << 20)])
    word = rng.getrandbits(64)
    return kind, pack(program_write_layout(config), addr=addr, word=word), {
        "addr": addr, "word": word}


def account(config, requests, memory, mrf):
    """What the requests must cause, in order: a dict of event lists and ``prog_len``."""
    spaces = {s.value for s in vector_spaces(config)}
    out = {key: [] for key in ("codes", "writes", "reads", "vec_resp", "mrf_w", "w_rows",
                               "mrf_r", "mrf_resp", "prog")}
    prog_len = 0
    for kind, bits, f in requests:
        if kind in ("vec_w", "vec_r"):
            depth = config.ivrf_depth if f["space"] == Space.IVRF.value else config.vrf_depth
            code = (ErrorCode.ILLEGAL_FIELD if f["space"] not in spaces
                    else ErrorCode.ADDRESS_RANGE if f["addr"] >= depth else None)
            if code is not None:
                out["codes"].append(code)
            if kind == "vec_r":
                out["vec_resp"].append(0 if code else memory[f["space"], f["addr"]])
                if code is None:
                    out["reads"].append((f["space"], f["addr"]))
            elif code is None:
                out["writes"] += [(f["space"], f["addr"], b, beat) for b, beat
                                  in enumerate(beats_of(config, f["values"]))]
        elif kind in ("mrf_w", "w_rows", "mrf_r"):
            bad_word = (f["exponent"] > 142 if kind == "mrf_w"
                        else f["static"] and f["static_exponent"] > 142 if kind == "w_rows"
                        else False)
            code = (ErrorCode.ADDRESS_RANGE if f["engine"] >= config.tiles
                    else ErrorCode.MRF_WORD if bad_word else None)
            if code is not None:
                out["codes"].append(code)
            else:
                out[kind].append(bits)
            if kind == "mrf_r":
                key = (f["engine"], f["row"], f["slot"])
                out["mrf_resp"].append(0 if code else mrf[key])
        elif f["addr"] >= config.program_depth:
            out["codes"].append(ErrorCode.PROGRAM_RANGE)
        else:
            out["prog"].append((f["addr"], kept_fields(f["word"])))
            prog_len = 1 if f["addr"] == 0 else max(prog_len, f["addr"] + 1)
    return out, prog_len


def run_host_access(config, seed, count=120, p_ready=0.6):
    rng = random.Random(seed)
    dut = HostAccess(config)
    requests = [random_request(rng, config) for _ in range(count)]
    memory = {(s, a): rng.getrandbits(16 * config.n)
              for s in range(16) for a in range(max(config.ivrf_depth, config.vrf_depth))}
    # The MVM's answer to each read-back request, drawn up front.
    mrf = {(f["engine"], f["row"], f["slot"]): rng.getrandbits(8 + config.n
                                                                * config.mantissa_bits_w)
           for kind, _, f in requests if kind == "mrf_r"}
    expected, expected_len = account(config, requests, memory, mrf)
    seen = {key: [] for key in expected}
    state = {"next": 0, "offering": False, "open": True,
             "reads": [None] * RD_DATA_LATENCY, "mrf_pending": [],
             "mrf_offer": False}
    host_ports = {kind: getattr(dut, PORTS[kind]) for kind in KINDS}

    async def cycle(ctx):
        # A program runs now and then: nothing may be taken while it does.
        if rng.random() < 0.05:
            state["open"] = not state["open"]
        ctx.set(dut.open, state["open"])
        # The memories answer the read of RD_DATA_LATENCY cycles before (random data in
        # other cycles: a response taken a cycle early or late is caught).
        read = state["reads"][0]
        ctx.set(dut.rd_data.as_value(),
                memory[read] if read is not None else rng.getrandbits(16 * config.n))
        # The current request, offered after a random delay and held until taken.
        if state["next"] < len(requests) and not state["offering"]:
            state["offering"] = rng.random() < 0.5
        kind = requests[state["next"]][0] if state["next"] < len(requests) else None
        for name, port in host_ports.items():
            offer = state["offering"] and name == kind
            ctx.set(port.valid, offer)
            ctx.set(port.payload.as_value(),
                    requests[state["next"]][1] if offer else rng.getrandbits(16))
        for name in ("vec_r_resp", "mrf_r_resp", "mvm_mrf_w", "mvm_w_rows", "mvm_mrf_r_req"):
            ctx.set(getattr(dut, name).ready, rng.random() < p_ready)
        if state["mrf_pending"] and not state["mrf_offer"]:
            state["mrf_offer"] = rng.random() < 0.5
        resp = dut.mvm_mrf_r_resp
        ctx.set(resp.valid, state["mrf_offer"])
        ctx.set(resp.payload.as_value(),
                state["mrf_pending"][0] if state["mrf_offer"] else rng.getrandbits(8))

        # What the cycle does (outputs settled).
        if not state["open"]:
            assert not any(ctx.get(p.ready) for p in host_ports.values()), "taken while closed"
            assert not (ctx.get(dut.wr.en) or ctx.get(dut.rd.en) or ctx.get(dut.prog.en))
        code = ctx.get(dut.access_set)
        if code != ErrorCode.NONE:
            seen["codes"].append(code)
        if ctx.get(dut.wr.en):
            seen["writes"].append((ctx.get(dut.wr.space), ctx.get(dut.wr.addr),
                                   ctx.get(dut.wr.beat) if config.beats > 1 else 0,
                                   ctx.get(dut.wr.data.as_value())))
        read = None
        if ctx.get(dut.rd.en):
            read = (ctx.get(dut.rd.space), ctx.get(dut.rd.addr))
            seen["reads"].append(read)
        state["reads"] = state["reads"][1:] + [read]
        if ctx.get(dut.prog.en):
            data = dut.prog.data
            seen["prog"].append((ctx.get(dut.prog.addr),
                                 {name: ctx.get(getattr(data, name)) for name in KEPT_FIELDS}))
        for name, key in (("mvm_mrf_w", "mrf_w"), ("mvm_w_rows", "w_rows"),
                          ("mvm_mrf_r_req", "mrf_r")):
            port = getattr(dut, name)
            if ctx.get(port.valid) and ctx.get(port.ready):
                bits = ctx.get(port.payload.as_value())
                seen[key].append(bits)
                if key == "mrf_r":
                    p = port.payload
                    state["mrf_pending"].append(
                        mrf[ctx.get(p.engine), ctx.get(p.row), ctx.get(p.slot)])
        for name, key in (("vec_r_resp", "vec_resp"), ("mrf_r_resp", "mrf_resp")):
            port = getattr(dut, name)
            if ctx.get(port.valid) and ctx.get(port.ready):
                seen[key].append(ctx.get(port.payload.as_value()))
        if state["mrf_offer"] and ctx.get(resp.ready):
            state["mrf_pending"].pop(0)
            state["mrf_offer"] = False
        if kind is not None and state["offering"] and ctx.get(host_ports[kind].ready):
            state["next"] += 1
            state["offering"] = False

    def done():
        return (state["next"] == len(requests)
                and len(seen["vec_resp"]) == len(expected["vec_resp"])
                and len(seen["mrf_resp"]) == len(expected["mrf_resp"]))

    run(dut, cycle, done, limit=200 * count)
    for key, events in expected.items():
        assert seen[key] == events, f"{key}: {len(seen[key])} events, {len(events)} expected"
    return expected, expected_len


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_host_access_against_the_account(build, seed):
    config = ALL_BUILDS[build]
    expected, _ = run_host_access(config, seed)
    # The draw reaches every kind of event (a seed that did not would test less).
    assert all(expected[key] for key in expected), {k: len(v) for k, v in expected.items()}


def test_program_length_follows_the_writes():
    """The program's length: 1 after a write at address 0, else one more than the
    highest address written since; a refused write leaves it."""
    from amaranth.sim import Simulator
    config = ALL_BUILDS["n8t1l8"]
    dut = HostAccess(config)
    lengths = []

    async def bench(ctx):
        ctx.set(dut.open, 1)
        for addr in (0, 1, 2, 7, 3, config.program_depth, 0, 4):
            ctx.set(dut.prog_w.valid, 1)
            ctx.set(dut.prog_w.payload.addr, addr)
            await ctx.tick()
            lengths.append(ctx.get(dut.prog_len))
        ctx.set(dut.prog_w.valid, 0)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert lengths == [1, 2, 3, 8, 8, 8, 1, 5]


def test_refuses_a_config_of_the_wrong_type():
    with pytest.raises(TypeError, match="config must be an NpuConfig"):
        HostAccess({"n": 8})
