"""The coordinator side: plan cells, launch one worker process per cell, collect records."""
