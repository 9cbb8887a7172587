"""A text classifier of your own: sentences made here, tokenized with tf_keras'
TextVectorization in the data function, and a model that starts with an Embedding layer.

    tfsync run examples/text_classifier/job.toml

`data` generates a deterministic corpus (`seed`) of short sentences about four topics
(sports, weather, cooking, money): filler words every topic shares, one to three words
of the sentence's own topic and often words of other topics, so a single word can
mislead and the model has to weigh them (`sentences` says how). TextVectorization learns the
vocabulary from the training sentences and turns every sentence into `length` token
ids (0 = padding, 1 = a word it does not know, e.g. a test word never seen in
training): int32 arrays, labels int64 topic ids. The workers get only the arrays; they
never see a string. Swap in your own sentences and labels here: the rest stays as it is.

`build` is Embedding (mask_zero: padding is left out of the mean) ->
GlobalAveragePooling1D -> Dense -> Dense(4 logits), or with `conv=True` a Conv1D over
the embeddings (word order: a window of `kernel` tokens) with global max pooling.
"""

from __future__ import annotations

import numpy as np
import tf_keras as keras

TOPICS = {
    "sports": "match goal team coach player league score referee stadium season striker tournament "
              "keeper defender final",
    "weather": "rain storm forecast wind snow cloud sunny temperature thunder humid fog frost "
               "drizzle breeze heatwave",
    "cooking": "recipe oven garlic flour simmer butter onion bake pepper sauce dough roast "
               "spice kitchen chef",
    "money": "stock market price bank loan interest budget invest profit tax salary bond "
             "inflation shares debt",
}
CLASS_NAMES = tuple(TOPICS)
FILLER = ("the a this that today yesterday we they people said about really very new old "
          "again after before some many more most there here was is were be will can "
          "could would our their my your it of in on at for with and but or so").split()


def sentences(n: int, seed: int = 0, tie: float = 0.25) -> tuple[list[str], np.ndarray]:
    """`n` sentences of 5 to 10 words and their topic ids. A sentence has 1 to 3 words of
    its own topic and fewer of other topics, except that a sentence with one word of its
    own topic has, with probability `tie`, one word of another as well: nothing in it
    says which of the two it is about (about 8 % of sentences, so accuracy tops out
    near 96 %)."""
    rng = np.random.default_rng(seed)
    words = {t: v.split() for t, v in TOPICS.items()}
    texts, labels = [], rng.integers(0, len(TOPICS), n)
    for label in labels:
        own = int(rng.integers(1, 4))
        others = int(rng.integers(0, own)) if own > 1 else int(rng.random() < tie)
        picked = list(rng.choice(words[CLASS_NAMES[label]], own))
        for _ in range(others):
            other = CLASS_NAMES[(label + rng.integers(1, len(TOPICS))) % len(TOPICS)]
            picked.append(rng.choice(words[other]))
        length = max(int(rng.integers(5, 11)), len(picked))
        picked += [FILLER[i] for i in rng.integers(0, len(FILLER), length - len(picked))]
        texts.append(" ".join(picked[i] for i in rng.permutation(length)))
    return texts, labels.astype(np.int64)


def data(train: int = 20_000, test: int = 2_000, length: int = 12, vocabulary: int = 200, seed: int = 0):
    """((x_train, y_train), (x_test, y_test)): int32 token ids (N, length), int64 topic ids."""
    import tensorflow as tf

    train_text, y_train = sentences(train, seed)
    test_text, y_test = sentences(test, seed + 1)
    vectorize = keras.layers.TextVectorization(max_tokens=vocabulary, output_sequence_length=length)
    vectorize.adapt(tf.constant(train_text))  # the vocabulary, from the training sentences only
    x_train = vectorize(tf.constant(train_text)).numpy().astype(np.int32)
    x_test = vectorize(tf.constant(test_text)).numpy().astype(np.int32)
    return (x_train, y_train), (x_test, y_test)


def build(vocabulary: int = 200, length: int = 12, dim: int = 16, units: int = 32, classes: int = 4,
          conv: bool = False, kernel: int = 3, seed: int = 0):
    """Token ids (N, length) -> logits (N, classes)."""
    inputs = keras.layers.Input((length,), dtype="int32")
    x = keras.layers.Embedding(vocabulary, dim, mask_zero=not conv,
                               embeddings_initializer=keras.initializers.RandomUniform(-0.05, 0.05, seed=seed))(inputs)
    if conv:
        x = keras.layers.Conv1D(units, kernel, padding="same", activation="relu",
                                kernel_initializer=keras.initializers.GlorotUniform(seed + 1))(x)
        x = keras.layers.GlobalMaxPooling1D()(x)
    else:
        x = keras.layers.GlobalAveragePooling1D()(x)
    x = keras.layers.Dense(units, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(seed + 2))(x)
    outputs = keras.layers.Dense(classes, kernel_initializer=keras.initializers.GlorotUniform(seed + 3))(x)
    return keras.Model(inputs, outputs, name="text_classifier")
