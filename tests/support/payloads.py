"""Realistic payloads built from the pipeline team's field lists (seed 003), deterministic by seed."""

from __future__ import annotations

import random
from typing import Any

STATUSES = ["out", "questionable", "doubtful", "probable", "available"]
REASONS = [
    ("Injury/Illness - Left Ankle; Sprain", "injury"),
    ("G League - Two-Way", "g_league"),
    ("Injury/Illness - Right Knee; Soreness", "injury"),
    ("Suspension - League", "suspension"),
    ("Rest", "rest"),
]
TEAMS = ["LAL", "BOS", "GSW", "MIL", "DEN", "PHX", "NYK", "MIA", "DAL", "PHI"]
BOOKS = ["draftkings", "fanduel", "betmgm", "caesars", "pointsbet"]


def injury_row(i: int, rng: random.Random, game_date: str = "2025-01-10") -> dict[str, Any]:
    home, away = TEAMS[i % len(TEAMS)], TEAMS[(i + 3) % len(TEAMS)]
    reason, category = REASONS[i % len(REASONS)]
    return {
        "player_lookup": f"player{i:04d}",
        "player_name_original": f"Player {i}",
        "player_full_name": f"Player Number {i}",
        "team": home,
        "game_date": game_date,
        "game_id": f"{game_date.replace('-', '')}_{away}_{home}",
        "matchup": f"{away}@{home}",
        "away_team": away,
        "home_team": home,
        "game_time": "19:30 ET",
        "injury_status": STATUSES[i % len(STATUSES)],
        "reason": reason,
        "reason_category": category,
        "report_date": game_date,
        "report_hour": rng.choice([9, 13, 17, 20]),
        "scrape_time": f"{game_date}T{rng.randint(10, 23)}:{rng.randint(10, 59)}:00Z",
        "run_id": f"run-{rng.getrandbits(32):08x}",
        "source_file_path": f"gs://nba-scraped/injury/{game_date}/{rng.getrandbits(24):06x}.json",
        "processed_at": f"{game_date}T{rng.randint(10, 23)}:{rng.randint(10, 59)}:01Z",
        "confidence_score": round(rng.uniform(0.8, 1.0), 3),
        "overall_report_confidence": 0.97,
    }


def injury_report(rows: int, seed: int = 1, game_date: str = "2025-01-10") -> dict[str, Any]:
    """An NBA.com injury report as the raw processor publishes it: metadata plus one row per player."""
    rng = random.Random(seed)
    return {
        "source": "nbac_injury_report",
        "game_date": game_date,
        "report_date": game_date,
        "report_hour": 17,
        "scrape_time": f"{game_date}T17:0{seed % 10}:00Z",
        "run_id": f"run-{rng.getrandbits(32):08x}",
        "players": [injury_row(i, rng, game_date) for i in range(rows)],
    }


def props_snapshot(rows: int, seed: int = 1, game_id: str = "0022400500") -> dict[str, Any]:
    """An odds-api points-props snapshot: lines (that matter) and prices (that do not)."""
    rng = random.Random(seed)
    return {
        "game_id": game_id,
        "game_date": "2025-01-10",
        "snapshot_timestamp": f"2025-01-10T1{seed % 10}:00:00Z",
        "props": [
            {
                "player_lookup": f"player{i // len(BOOKS):04d}",
                "bookmaker": BOOKS[i % len(BOOKS)],
                "game_id": game_id,
                "game_date": "2025-01-10",
                "points_line": 10.5 + (i % 20),
                "over_price": round(rng.uniform(1.7, 2.1), 2),
                "over_price_american": rng.choice([-120, -115, -110, -105, 100]),
                "under_price": round(rng.uniform(1.7, 2.1), 2),
                "under_price_american": rng.choice([-120, -115, -110, -105, 100]),
                "snapshot_timestamp": f"2025-01-10T1{seed % 10}:00:00Z",
                "bookmaker_last_update": f"2025-01-10T1{seed % 10}:0{rng.randint(0, 9)}:00Z",
            }
            for i in range(rows)
        ],
    }
