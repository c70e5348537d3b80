//! ggml's tensor types as GGUF numbers them (gguf-py 0.19's
//! `GGMLQuantizationType`, and llama.cpp's for Q1_0 and Q2_0, which
//! gguf-py 0.19 lacks), with their block geometry (`GGML_QUANT_SIZES`).
//! Forks number their 1- and 2-bit types otherwise (PrismML's own 2-bit
//! type is 128 elements in 34 bytes): a file whose bytes disagree with
//! these sizes is refused where it is read.

use std::fmt;

/// Elements of a K-quant super-block.
const QK_K: u32 = 256;

macro_rules! ggml_types {
    ($($(#[$doc:meta])* $name:ident = $id:literal, $block:expr, $bytes:expr;)*) => {
        /// A ggml tensor type (the variants are named as gguf-py names them).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
        #[allow(non_camel_case_types, missing_docs)]
        pub enum GgmlType {
            $($(#[$doc])* $name = $id,)*
        }

        impl GgmlType {
            /// The type numbered `id`; `None` for numbers ggml retired or never used.
            pub fn from_id(id: u32) -> Option<GgmlType> {
                match id {
                    $($id => Some(GgmlType::$name),)*
                    _ => None,
                }
            }

            /// Its name, as gguf-py and llama.cpp print it.
            pub fn name(self) -> &'static str {
                match self {
                    $(GgmlType::$name => stringify!($name),)*
                }
            }

            /// (elements per block, bytes per block).
            pub fn block(self) -> (u32, u32) {
                match self {
                    $(GgmlType::$name => ($block, $bytes),)*
                }
            }
        }
    };
}

ggml_types! {
    F32 = 0, 1, 4;
    F16 = 1, 1, 2;
    Q4_0 = 2, 32, 2 + 16;
    Q4_1 = 3, 32, 2 + 2 + 16;
    Q5_0 = 6, 32, 2 + 4 + 16;
    Q5_1 = 7, 32, 2 + 2 + 4 + 16;
    Q8_0 = 8, 32, 2 + 32;
    Q8_1 = 9, 32, 4 + 4 + 32;
    Q2_K = 10, QK_K, 2 + 2 + QK_K / 16 + QK_K / 4;
    Q3_K = 11, QK_K, 2 + QK_K / 4 + QK_K / 8 + 12;
    Q4_K = 12, QK_K, 2 + 2 + QK_K / 2 + 12;
    Q5_K = 13, QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12;
    Q6_K = 14, QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16;
    Q8_K = 15, QK_K, 4 + QK_K + QK_K / 8;
    IQ2_XXS = 16, QK_K, 2 + QK_K / 4;
    IQ2_XS = 17, QK_K, 2 + QK_K / 4 + QK_K / 32;
    IQ3_XXS = 18, QK_K, 2 + QK_K / 4 + QK_K / 8;
    IQ1_S = 19, QK_K, 2 + QK_K / 8 + QK_K / 16;
    IQ4_NL = 20, 32, 2 + 16;
    IQ3_S = 21, QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4;
    IQ2_S = 22, QK_K, 2 + QK_K / 4 + QK_K / 16;
    IQ4_XS = 23, QK_K, 2 + 2 + QK_K / 2 + QK_K / 64;
    I8 = 24, 1, 1;
    I16 = 25, 1, 2;
    I32 = 26, 1, 4;
    I64 = 27, 1, 8;
    F64 = 28, 1, 8;
    IQ1_M = 29, QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32;
    BF16 = 30, 1, 2;
    TQ1_0 = 34, QK_K, 2 + 4 * 13;
    TQ2_0 = 35, QK_K, 2 + 64;
    MXFP4 = 39, 32, 1 + 16;
    NVFP4 = 40, 64, 4 + 32;
    Q1_0 = 41, 128, 2 + 16;
    Q2_0 = 42, 64, 2 + 16;
}

impl GgmlType {
    /// Bytes of a row of `elements` elements; `None` when they are not
    /// whole blocks (or the size overflows).
    pub fn row_bytes(self, elements: u64) -> Option<u64> {
        let (block, bytes) = self.block();
        elements
            .is_multiple_of(block as u64)
            .then(|| (elements / block as u64).checked_mul(bytes as u64))
            .flatten()
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::GgmlType;

    #[test]
    fn ids_round_trip_and_retired_ones_are_unknown() {
        for id in 0..64 {
            if let Some(t) = GgmlType::from_id(id) {
                assert_eq!(t as u32, id, "{t}");
            }
        }
        for retired in [4, 5, 31, 32, 33, 36, 37, 38, 43] {
            assert_eq!(GgmlType::from_id(retired), None, "{retired}");
        }
        assert_eq!(GgmlType::Q4_K.block(), (256, 144));
        assert_eq!(GgmlType::Q6_K.block(), (256, 210));
        assert_eq!(GgmlType::Q8_0.row_bytes(64), Some(68));
        assert_eq!(GgmlType::Q8_0.row_bytes(65), None);
        assert_eq!(GgmlType::Q1_0.block(), (128, 18));
        assert_eq!(GgmlType::Q2_0.block(), (64, 18));
    }
}
