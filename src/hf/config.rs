//! The output's `config.json`: the checkpoint's, rewritten for dense weights.

use serde_json::Value;

use crate::numerics::{DtypeChoice, OutDtype};

/// The checkpoint's `config.json` as the dense output's: without its
/// `quantization_config` (nor MLX's `quantization`, nor DeepSeek-V4's
/// top-level `expert_dtype`, which says how its experts were quantized),
/// and with its dtypes set to the one asked for.
pub(crate) fn dense_config(config: &Value, choice: DtypeChoice) -> Value {
    let mut v = config.clone();
    if let Some(obj) = v.as_object_mut() {
        if obj.remove("quantization_config").is_some() {
            obj.remove("expert_dtype");
        }
        obj.remove("quantization");
    }
    if let DtypeChoice::Fixed(to) = choice {
        set_config_dtype(&mut v, to);
    }
    v
}

/// Sets every dtype entry of a `config.json` (`torch_dtype`, `dtype`, also in
/// nested configs such as `text_config`) that names a floating dtype to `to`.
fn set_config_dtype(v: &mut Value, to: OutDtype) {
    let Some(obj) = v.as_object_mut() else {
        return;
    };
    for (key, value) in obj.iter_mut() {
        match value {
            Value::String(name)
                if (key == "torch_dtype" || key == "dtype")
                    && OutDtype::from_name(name).is_some() =>
            {
                *name = to.torch_name().to_string();
            }
            Value::Object(_) => set_config_dtype(value, to),
            _ => {}
        }
    }
}
