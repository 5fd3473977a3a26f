"""Writes an ONNX model with the onnx package: initializers as raw_data and
as typed repeated fields."""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import common


def write(out):
    arrs = common.arrays()
    inits, exp = [], {}
    for k in ["f32", "f64", "f16", "i64", "i32", "i8", "u8", "bool"]:
        inits.append(numpy_helper.from_array(arrs[k], name=k))
        exp[k] = common.entry(arrs[k])
    # Typed fields (float_data / int64_data), not raw_data.
    inits.append(helper.make_tensor("typed_f", TensorProto.FLOAT, [2, 2], [1.0, 2.0, 3.5, -4.0]))
    inits.append(helper.make_tensor("typed_i", TensorProto.INT64, [3], [1, -2, 3]))
    exp["typed_f"] = common.entry(np.array([[1.0, 2.0], [3.5, -4.0]], dtype="<f4"))
    exp["typed_i"] = common.entry(np.array([1, -2, 3], dtype="<i8"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])
    node = helper.make_node("Add", ["x", "f32"], ["y"])
    graph = helper.make_graph([node], "g", [x], [y], initializer=inits)
    model = helper.make_model(graph)
    onnx.save(model, os.path.join(out, "model.bin"))  # no .onnx: found by content
    return {"model.bin": exp}


if __name__ == "__main__":
    common.main(write)
