"""Writes tests/gguf/hf-qwen3-split: hf-qwen3's model.gguf split in two by
gguf-py's own writer (`NAME-00001-of-00002.gguf`, `split.*` keys), whose
dense form is hf-qwen3's (`expected-bf16.digests.json`). Needs
`pip install gguf==0.19.0`.

    python tests/gguf/make_hf_split.py
"""

from pathlib import Path

import gguf

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "hf-qwen3" / "model" / "model.gguf"
OUT = HERE / "hf-qwen3-split" / "model"

reader = gguf.GGUFReader(str(SOURCE))
OUT.mkdir(parents=True, exist_ok=True)
arch = reader.fields["general.architecture"].contents()
half = len(reader.tensors) // 2 + 1
writer = gguf.GGUFWriter(str(OUT / "model.gguf"), arch, split_max_tensors=half)
for field in reader.fields.values():
    if field.name.startswith("GGUF.") or field.name == "general.architecture":
        continue
    vtype = field.types[0]
    sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
    writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
for t in reader.tensors:
    writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
writer.write_header_to_file()
writer.write_kv_data_to_file()
writer.write_tensors_to_file()
writer.close()
print(sorted(p.name for p in OUT.iterdir()))
