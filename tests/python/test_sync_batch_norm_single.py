"""SyncBatchNormalization in a plain `python` process (no mpirun/bfrun): a model trained with it
matches BatchNormalization, is saved, and is loaded in a fresh process, where inference needs
no bf.init() and training works after it."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np, keras
    import bluefog.tensorflow.keras as bfk

    path, stage = sys.argv[1], sys.argv[2]
    x = np.arange(24, dtype=np.float32).reshape(8, 3) % 5
    if stage == "save":
        bfk.init()
        model = keras.Sequential([keras.Input((3,)), bfk.layers.SyncBatchNormalization()])
        model.compile(optimizer=bfk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
        model.fit(x, x, batch_size=8, epochs=2, verbose=0)
        ref = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization()])
        ref.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        ref.fit(x, x, batch_size=8, epochs=2, verbose=0)
        for a, b in zip(model.get_weights(), ref.get_weights()):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        model.save(path)
        np.save(path + ".npy", model.predict(x, verbose=0))
    else:
        model = keras.models.load_model(path)
        assert type(model.layers[0]) is bfk.layers.SyncBatchNormalization
        np.testing.assert_allclose(model.predict(x, verbose=0), np.load(path + ".npy"),
                                   rtol=1e-6)
        bfk.init()
        model.fit(x, x, batch_size=8, epochs=1, verbose=0)
    print("OK", stage)
""")


def test_save_train_load_without_mpirun(tmp_path):
    path = str(tmp_path / "model.keras")
    for stage in ("save", "load"):
        result = subprocess.run([sys.executable, "-c", SCRIPT, path, stage], capture_output=True,
                                text=True, timeout=300,
                                env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin",
                                     "HOME": str(tmp_path)})
        assert result.returncode == 0 and f"OK {stage}" in result.stdout, (
            result.stdout[-2000:] + result.stderr[-4000:])
