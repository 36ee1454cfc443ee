for i in 1 2 3; do echo "row $i" >> table.txt; done
sed -i 's/row/ROW/' table.txt
cat table.txt
