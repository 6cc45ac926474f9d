"""AppSettings: the keys a user's settings already hold are read back typed, and written to the same keys."""

from __future__ import annotations

from PySide6.QtCore import QByteArray, QSettings

from studio.qt.settings import MAX_RECENT, AppSettings

# The keys the app has always written; renaming one would silently drop what users chose.
SAVED = {
    "recent/models": ["/models/b", "/models/a"],
    "window/page": "Plan",
    "view/theme": "dark",
    "export/output_folder": "/exports",
    "export/preset": "Q6_K",
    "export/backend": "llama.cpp",
    "quantize/device": "cuda:1",
}


def test_saved_settings_are_read_typed_and_written_back_to_their_keys(tmp_path):
    path = str(tmp_path / "s.ini")
    raw = QSettings(path, QSettings.Format.IniFormat)
    for key, value in SAVED.items():
        raw.setValue(key, value)
    raw.setValue("window/geometry", QByteArray(b"geometry"))
    raw.sync()

    s = AppSettings.from_file(path)
    assert s.recent_models == ["/models/b", "/models/a"]
    assert (s.page, s.theme, s.device) == ("Plan", "dark", "cuda:1")
    assert (s.export_folder, s.export_preset, s.export_backend) == ("/exports", "Q6_K", "llama.cpp")
    assert s.window_geometry == QByteArray(b"geometry") and s.window_state is None

    s.theme, s.device, s.export_backend = "light", "cpu", "studio"
    s.recent_models = [f"/m/{i}" for i in range(MAX_RECENT + 3)]
    s.sync()
    again = QSettings(path, QSettings.Format.IniFormat)
    assert (again.value("view/theme"), again.value("quantize/device")) == ("light", "cpu")
    assert again.value("export/backend") == "studio"
    assert AppSettings(again).recent_models == [f"/m/{i}" for i in range(MAX_RECENT)]


def test_defaults_and_odd_values(tmp_path):
    path = str(tmp_path / "s.ini")
    s = AppSettings.from_file(path)
    assert s.recent_models == [] and s.theme == "system" and s.export_backend == "studio"
    assert s.page == "" and s.device == "" and s.window_geometry is None
    raw = QSettings(path, QSettings.Format.IniFormat)
    raw.setValue("view/theme", "purple")  # hand-edited or from a future version
    raw.setValue("recent/models", ["/only/one"])  # an INI file gives a one-element list back as a string
    raw.sync()
    s = AppSettings.from_file(path)
    assert s.theme == "system"
    assert s.recent_models == ["/only/one"]


def test_calibration_choices_round_trip_and_odd_values_fall_back(tmp_path):
    path = str(tmp_path / "s.ini")
    s = AppSettings.from_file(path)
    assert (s.calib_source, s.calib_file, s.calib_ctx, s.calib_chunks) == ("builtin", "", 512, 0)
    s.calib_source, s.calib_file, s.calib_ctx, s.calib_chunks = "chat", "/t/c.jsonl", 256, 8
    s.sync()
    s = AppSettings.from_file(path)
    assert (s.calib_source, s.calib_file, s.calib_ctx, s.calib_chunks) == ("chat", "/t/c.jsonl", 256, 8)
    raw = QSettings(path, QSettings.Format.IniFormat)
    raw.setValue("calibrate/ctx", "many")
    raw.setValue("calibrate/chunks", -3)
    raw.setValue("calibrate/source", "web")
    raw.sync()
    s = AppSettings.from_file(path)
    assert (s.calib_source, s.calib_ctx, s.calib_chunks) == ("builtin", 512, 0)
