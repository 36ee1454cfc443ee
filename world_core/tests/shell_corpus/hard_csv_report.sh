cat > sales.csv <<'EOF'
region,amount
north,10
south,5
north,7
EOF
tail -n +2 sales.csv | awk -F, '{t[$1]+=$2} END {for (r in t) print r","t[r]}' | sort > report.csv
cat report.csv
