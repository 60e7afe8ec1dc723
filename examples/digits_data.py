"""The digits data both main-job examples train on: scikit-learn's 8x8 digits (1,797 images,
shipped with scikit-learn), one stratified 80/20 split, each rank's share of the training set."""

from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def load_data(rank, size):
    """((x_train, y_train) of this rank, (x_test, y_test) whole); images float32 in [0, 1],
    shape (8, 8, 1)."""
    digits = load_digits()
    images = (digits.images / 16.0).astype("float32")[..., None]
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target, test_size=0.2, random_state=0, stratify=digits.target)
    return (x_train[rank::size], y_train[rank::size]), (x_test, y_test)
