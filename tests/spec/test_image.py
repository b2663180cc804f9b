"""The network image file (``host.spec.image``): round trip, version 1 files, refusals."""

import json

import numpy as np
import pytest

from host.spec.image import IMAGE_VERSION, ImageError, NetworkImage
from host.spec.isa import Space


def _image(**kw):
    vec = np.arange(16, dtype=np.uint16).reshape(2, 8)
    return NetworkImage(program=np.array([1, 2, 3], np.uint64),
                        memories=[(Space.MRF, 4, [0, 1 << 70, 5])],
                        job_memories=[(Space.IVRF, 2, vec)], outputs=3, **kw)


def test_round_trip_keeps_the_job_signature_and_extra_records(tmp_path):
    extra = {"signature": {"input_shape": [1, 12], "output_shape": [1, 10]},
             "report": {"layers": []}}
    _image(inputs=5, config={"n": 8}, extra=extra).save(tmp_path / "a.npz")
    back = NetworkImage.load(tmp_path / "a.npz")
    assert back.inputs == 5 and back.outputs == 3 and back.extra == extra
    assert back.config == {"n": 8}
    assert back.memories == [(Space.MRF, 4, [0, 1 << 70, 5])]
    space, addr, data = back.job_memories[0]
    assert (space, addr) == (Space.IVRF, 2) and np.array_equal(data, _image().job_memories[0][2])
    with np.load(tmp_path / "a.npz") as f:
        assert json.loads(str(f["meta"][()]))["version"] == IMAGE_VERSION == 2


def test_version_1_files_still_load(tmp_path):
    meta = {"format": "bfp-npu-image", "version": 1, "outputs": 2, "config": None,
            "memories": [{"space": "IVRF", "addr": 0, "every_job": True}]}
    np.savez(tmp_path / "v1.npz", program=np.array([7], np.uint64),
             meta=np.array(json.dumps(meta)), mem0=np.zeros((1, 8), np.uint16))
    image = NetworkImage.load(tmp_path / "v1.npz")
    assert image.inputs is None and image.outputs == 2 and image.extra == {}
    image.check_job(17)                          # unknown size: any job is taken


def test_check_job_names_both_sizes():
    image = _image(inputs=4)
    image.check_job(4)
    with pytest.raises(ValueError, match="job 3 has 5 input vectors; the image takes 4"):
        image.check_job(5, "job 3")


@pytest.mark.parametrize("meta, says", [
    ({"format": "other", "version": 2}, "not a 'bfp-npu-image' image"),
    ({"format": "bfp-npu-image", "version": 3}, "version 1 or 2"),
    ({"format": "bfp-npu-image", "version": 2, "inputs": -1}, "'inputs' must be"),
    ({"format": "bfp-npu-image", "version": 2, "extra": [1]}, "'extra' must be"),
    ({"format": "bfp-npu-image", "version": 2, "outputs": 0}, "'outputs' must be"),
])
def test_malformed_meta_is_refused_naming_the_field(tmp_path, meta, says):
    np.savez(tmp_path / "m.npz", program=np.array([7], np.uint64),
             meta=np.array(json.dumps(meta)))
    with pytest.raises(ImageError, match=says):
        NetworkImage.load(tmp_path / "m.npz")


def test_truncated_file_is_an_image_error(tmp_path):
    _image(inputs=1).save(tmp_path / "a.npz")
    raw = (tmp_path / "a.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ImageError, match="cut.npz"):
        NetworkImage.load(tmp_path / "cut.npz")
