"""The legacy strategies on CUDA (naive, ddp, zero2, gemini, ``ColossalAIStrategy``: fronts over the engine's
`TrainingBackend`, one runtime for legacy and engine) belong in this module, with the lane's marks
(``pytestmark = MARKS`` from `gpu_lane`)."""
