// The products' entry points on devices without subgroups (and in
// browsers), appended to the decode module (shaders/decode/) and the
// products' fragments (shaders/matmul/): each invocation a subgroup of one
// (SHARE_X is never set).

@compute @workgroup_size(WG)
fn gemv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    product(wid, li, Subgroup(0u, 1u));
}

@compute @workgroup_size(WG)
fn gemv_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    product_rows(wid, li);
}

@compute @workgroup_size(WG)
fn gemv_t(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    product_t(wid, li, Subgroup(0u, 1u));
}

@compute @workgroup_size(WG)
fn gemv_dense(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    product_dense(wid, li, Subgroup(0u, 1u));
}

fn shuffle4(v: vec4<f32>, i: u32) -> vec4<f32> {
    return v;
}

fn shuffle1(v: f32, i: u32) -> f32 {
    return v;
}
