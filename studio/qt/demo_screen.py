"""What the demo opens on: a real outlier channel in the Inspector, and the chat question ready to send.

Kept out of the main window so that the window only says "the demo opened"; this module knows what in
SmolLM2-135M-Instruct is worth seeing first (``studio.core.demo``).
"""

from __future__ import annotations

from typing import Any

from studio.core.demo_facts import DEMO_OUTLIER_CHANNEL, DEMO_QUESTION, DEMO_TENSOR

FIRST_SCREEN_MESSAGE = (
    f"Demo: input channel {DEMO_OUTLIER_CHANNEL} of {DEMO_TENSOR} is about 12× the median channel, a real "
    "outlier. Next: File → Export GGUF with Q2_K, then send the question on the Chat page."
)


def show_first_screen(window: Any) -> bool:
    """Select the demo's outlier tensor in the Inspector and put the demo question in the chat box.

    Returns False (and changes nothing) when the open model is not the demo (it lacks the tensor).
    """
    info = window.state.info
    if info is None or DEMO_TENSOR not in {t.name for t in info.tensors}:
        return False
    inspector = window.panel("inspector")
    if inspector is not None:  # the outlier named among the red dots
        inspector.mark_input_channel(DEMO_TENSOR, DEMO_OUTLIER_CHANNEL, f"channel {DEMO_OUTLIER_CHANNEL}")
    window.state.select_tensor(DEMO_TENSOR)
    if window.panel("inspector") is not None:
        window.show_page("inspector")
    chat = window.panel("chat")
    if chat is not None and not chat.prompt.toPlainText().strip():
        chat.prompt.setPlainText(DEMO_QUESTION)
    banner = getattr(window, "banner", None)
    if banner is not None:
        banner.show_text(FIRST_SCREEN_MESSAGE)  # stays until dismissed, never cut off
    else:
        window.statusBar().showMessage(FIRST_SCREEN_MESSAGE, 60000)
    return True
