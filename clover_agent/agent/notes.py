"""What the agent tells the model about the run itself: a reply with no call, a reply cut off, a
call that never finished, an interrupt. Each is a message in the conversation, so the model knows
what happened and the trajectory shows it."""

NO_TOOL_CALL = (
    "Your reply contained no tool call. Every reply must call a tool: continue the work with one, "
    "or call `finish` with a summary if the task is done."
)
INTERRUPTED_CALL = (
    "This call did not complete: the run stopped while it ran and was resumed later in a fresh "
    "sandbox. The workspace is as it was before this call; run it again if it is still needed."
)
CUT_OFF = (
    "Your reply was cut off at the output length limit before it contained a complete tool call. "
    "Write less before the call (shorter reasoning), then call a tool."
)
#: The conversation's record of an interrupt (the user's own message follows it).
INTERRUPTED_REPLY = "[The user interrupted your reply before it was complete; it was discarded.]"
NOT_RUN = "[Not run: the user interrupted the turn before this call.]"
#: The result of a call an interrupt stopped.
INTERRUPTED_TOOL = (
    "[The user interrupted this call: it was stopped before it finished, with every process it "
    "started. What it did until then may have changed the workspace.]"
)
