"""A small Keras model for the profile's ``package.module:function`` form (tests)."""

from tf_mergecomp.keras2 import keras


def build():
    inputs = keras.Input((12,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    hidden = keras.layers.Dense(16, activation="relu")(hidden)
    return keras.Model(inputs, keras.layers.Dense(3)(hidden), name="tiny")
