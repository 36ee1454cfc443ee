printf 'needle\n' > hay.txt
if grep -q needle hay.txt; then echo found; fi
if ! grep -q absent hay.txt; then echo not-found; fi
