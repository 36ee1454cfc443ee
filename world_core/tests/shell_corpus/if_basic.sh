x=5
if [ "$x" -gt 3 ]; then echo big; else echo small; fi
