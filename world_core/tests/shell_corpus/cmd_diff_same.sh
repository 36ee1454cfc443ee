echo same > a; echo same > b
diff a b && echo identical
