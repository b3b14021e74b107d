// Package panel is what an operator sees of the models warden routes: each
// model's status as the admin API serves it (ModelStatus), assembled from
// its routing core's status and its fleet's metrics and health, and the
// panel page with its JSON twin (Data), which adds the token traffic of
// the last hour.
package panel
