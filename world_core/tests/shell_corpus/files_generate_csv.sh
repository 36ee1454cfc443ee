echo 'id,name' > users.csv
for i in 1 2 3; do echo "$i,user$i" >> users.csv; done
cut -d, -f2 users.csv | tail -n +2
