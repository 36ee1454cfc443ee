printf 'def a():\n    pass\ndef b():\n    pass\n' > m.py
grep -n '^def ' m.py | cut -d: -f1 | paste -sd' '
