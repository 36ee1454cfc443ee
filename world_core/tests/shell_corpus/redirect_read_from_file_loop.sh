printf 'k1=v1\nk2=v2\n' > kv.txt
while IFS='=' read -r k v; do echo "$v<-$k"; done < kv.txt
