// Rows of 32-bit words copied between two buffers by a list of row
// indices, bits as they are: a gather (dst's row i is src's row
// idx[first + i]) or a scatter (dst's row idx[first + i] is src's row i).
// Routed experts (src/backend/gpu/matmul/experts.rs) gather every row of
// x once, in expert order, multiply each expert's run of them, and
// scatter the results into the rows of y.

struct Gather {
    // Words a row.
    len: u32,
    // Rows copied.
    rows: u32,
    // The first of their indices in idx.
    first: u32,
    // 1 for a scatter, 0 for a gather.
    scatter: u32,
}

@group(0) @binding(0) var<uniform> gather: Gather;
@group(0) @binding(1) var<storage, read> idx: array<u32>;
@group(0) @binding(2) var<storage, read> src: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<u32>;

@compute @workgroup_size(64)
fn copy_rows(
    @builtin(global_invocation_id) id: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let i = id.y;
    if i >= gather.rows {
        return;
    }
    let r = idx[gather.first + i];
    var src_row = r;
    var dst_row = i;
    if gather.scatter != 0u {
        src_row = i;
        dst_row = r;
    }
    for (var j = id.x; j < gather.len; j += 64u * groups.x) {
        dst[dst_row * gather.len + j] = src[src_row * gather.len + j];
    }
}
