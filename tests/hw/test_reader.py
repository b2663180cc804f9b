"""The core's reader alone (``hw.core.reader.Reader``) in Amaranth's simulator: random
instances (windows, sources, products or not) against a plain Python account of the
vectors each must deliver (``docs/npu.md``, "Reader"), with the vector memories and the
input queue played by the bench, random offers on ``inq`` and ``instances`` and random
stalls on both outputs, at one and at four beats a vector.

The whole core, with the reader in its back end, is ``tests/hw/test_npu_hw.py``.
"""

import random

import pytest

from host.spec.isa import Space
from hw.core.reader import Reader, memory_spaces
from tests.hw.test_feeder_writer import BUILDS, Source, beats_of, run
from tests.hw.test_npu_hw import ALL_BUILDS


def random_instance(rng, config, sources):
    pix = rng.randint(1, 3)
    win_w, win_h = rng.randint(1, 2), rng.randint(1, 2)
    pitch = rng.randint(0, 3)
    return {"space": rng.choice(sources), "base": rng.randrange(8), "pix": pix,
            "win_w": win_w, "win_h": win_h, "pitch": pitch,
            "lanes_cols": rng.randint(1, config.n), "to_mvm": rng.random() < 0.5}


def account(config, instances, memory, queue):
    """The reader's output for ``instances``: ``(products, direct beats)``. Window order,
    address ``base + y*pitch + x*pix + k``; a product's lanes from ``lanes_cols`` on are
    zero in each pixel's last vector."""
    products, direct, queue = [], [], list(queue)
    for inst in instances:
        for y in range(inst["win_h"]):
            for x in range(inst["win_w"]):
                for k in range(inst["pix"]):
                    addr = inst["base"] + y * inst["pitch"] + x * inst["pix"] + k
                    vector = (queue.pop(0) if inst["space"] == Space.NETQ.value
                              else memory[inst["space"]][addr])
                    if inst["to_mvm"]:
                        if k == inst["pix"] - 1:
                            vector &= (1 << 16 * inst["lanes_cols"]) - 1
                        products.append(vector)
                    else:
                        direct += beats_of(config, vector)
    return products, direct


def run_reader(config, seed, probs, count=40):
    """``probs``: offer probabilities of instances and input vectors, ready
    probabilities of ``x_stream`` and ``direct``."""
    p_inst, p_inq, p_x, p_dir = probs
    rng = random.Random(seed)
    dut = Reader(config)
    spaces = memory_spaces(config)
    sources = [Space.NETQ.value] + [s for held in spaces.values() for s in held]
    memory = {s: [rng.getrandbits(16 * config.n) for _ in range(32)]
              for held in spaces.values() for s in held}
    instances = [random_instance(rng, config, sources) for _ in range(count)]
    queue_len = sum(i["pix"] * i["win_w"] * i["win_h"] for i in instances
                    if i["space"] == Space.NETQ.value)
    queue = [rng.getrandbits(16 * config.n) for _ in range(queue_len)]
    want_x, want_direct = account(config, instances, memory, queue)
    inst_src = Source(rng, instances, p_inst)
    inq_src = Source(rng, queue, p_inq)
    got_x, got_direct = [], []
    pending_read = {"req": None}

    async def cycle(ctx):
        inst_src.drive(ctx, dut.instances, lambda inst: 0)
        if inst_src.offering:
            p, inst = dut.instances.payload, inst_src.items[0]
            for field in ("space", "base", "pix", "win_w", "win_h", "pitch",
                          "lanes_cols", "to_mvm"):
                ctx.set(getattr(p, field), inst[field])
        inq_src.drive(ctx, dut.inq)
        # Each memory answers last cycle's read with the vector at that address, or
        # with noise where it does not hold the space read.
        req = pending_read["req"]
        for key, held in spaces.items():
            value = rng.getrandbits(16 * config.n)
            if req is not None and req[0] in held:
                value = memory[req[0]][req[1]]
            ctx.set(getattr(dut, f"{key}_data").as_value(), value)
        x_ready, d_ready = rng.random() < p_x, rng.random() < p_dir
        ctx.set(dut.x_stream.ready, x_ready)
        ctx.set(dut.direct.ready, d_ready)
        if ctx.get(dut.x_stream.valid) and x_ready:
            got_x.append(ctx.get(dut.x_stream.payload.as_value()))
        if ctx.get(dut.direct.valid) and d_ready:
            got_direct.append(ctx.get(dut.direct.payload.as_value()))
        pending_read["req"] = ((ctx.get(dut.rd.space), ctx.get(dut.rd.addr))
                               if ctx.get(dut.rd.en) else None)
        inst_src.took(ctx, dut.instances)
        inq_src.took(ctx, dut.inq)

    run(dut, cycle,
        lambda: len(got_x) >= len(want_x) and len(got_direct) >= len(want_direct)
        and not inst_src.items,
        limit=100 * (len(want_x) + len(want_direct)))
    assert not inq_src.items, f"{len(inq_src.items)} input vectors never read"
    for name, got, want in (("x_stream", got_x, want_x), ("direct", got_direct, want_direct)):
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g == w, f"{name} item {k}: {g:#x}, expected {w:#x}"


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("probs", [(1, 1, 1, 1), (0.5, 0.6, 0.7, 0.5), (1, 0.3, 0.2, 0.9)])
def test_reader_against_the_account(build, probs):
    run_reader(ALL_BUILDS[build], f"reader {build} {probs}", probs)
