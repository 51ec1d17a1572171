"""A clock the test moves by hand: lease expiry and windows without waiting."""


class ManualClock:
    def __init__(self, start: float = 1_767_225_600.0):  # 2026-01-01T00:00:00Z
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds
