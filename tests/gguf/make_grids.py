"""Writes src/formats/gguf/grids.rs: the IQ types' codebook grids exactly as
gguf-py 0.19 stores them (`grid_hex`, each entry an index into `grid_map`,
packed low bits first), for the decoder to unpack as gguf-py's `init_grid`
does. Needs `pip install gguf==0.19.0`.

    python tests/gguf/make_grids.py
"""

from pathlib import Path

from gguf import quants

OUT = Path(__file__).resolve().parents[2] / "src" / "formats" / "gguf" / "grids.rs"


def main():
    lines = [
        "//! The IQ types' codebook grids as gguf-py 0.19 stores them (`grid_hex`),",
        "//! written by `tests/gguf/make_grids.py`: hex digits, each byte holding",
        "//! indices into the type's `grid_map`, low bits first.",
        "",
    ]
    for cls in (quants.IQ2_XXS, quants.IQ2_XS, quants.IQ2_S, quants.IQ3_XXS, quants.IQ3_S, quants.IQ1_S):
        name = cls.__name__
        hexs = cls.grid_hex.decode()
        rows, per = cls.grid_shape
        lines.append(f"/// {name}: {rows} entries of {per}, `grid_map` {tuple(cls.grid_map)}.")
        lines.append(f"pub(super) const {name}: &[u8] = b\"\\")
        for i in range(0, len(hexs), 96):
            lines.append(f"{hexs[i:i + 96]}\\")
        lines.append('";')
        lines.append("")
    OUT.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
