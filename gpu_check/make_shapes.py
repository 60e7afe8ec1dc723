"""Writes gpu_check/shapes.json: the gradient shapes (trainable variables, in
order) of ResNet50 (keras.applications, ImageNet's 1000 classes, 224x224) and
BERT-base (uncased: 12 layers, width 768, 12 heads, feed-forward 3072, 30522
word pieces, 512 positions, with the pooler), so the GPU benchmark needs no
TensorFlow. ResNet50's come from Keras; BERT-base's from its architecture.

    .venv/bin/python gpu_check/make_shapes.py
"""

import json
from pathlib import Path


def resnet50_shapes():
    import tensorflow as tf

    model = tf.keras.applications.ResNet50(weights=None)
    return [list(v.shape) for v in model.trainable_variables]


def bert_base_shapes(layers=12, width=768, hidden=3072, vocabulary=30522, positions=512):
    shapes = [[vocabulary, width], [positions, width], [2, width], [width], [width]]
    for _ in range(layers):
        shapes += [[width, width], [width]] * 3  # query, key, value
        shapes += [[width, width], [width], [width], [width]]  # attention output, layer norm
        shapes += [[width, hidden], [hidden], [hidden, width], [width], [width], [width]]
    return shapes + [[width, width], [width]]  # pooler


def main():
    data = {
        "resnet50": resnet50_shapes(),
        "bert_base": bert_base_shapes(),
    }
    path = Path(__file__).resolve().parent / "shapes.json"
    path.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    for name, shapes in data.items():
        count = sum(int(__import__("math").prod(s)) for s in shapes)
        print("%s: %d tensors, %d parameters" % (name, len(shapes), count))


if __name__ == "__main__":
    main()
