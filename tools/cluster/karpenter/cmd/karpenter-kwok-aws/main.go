// Command karpenter-kwok-aws is Karpenter v1.14.1 with its kwok cloud provider (sigs.k8s.io/karpenter
// kwok/main.go), changed only where the test cluster must behave as the AWS provider does:
//
//   - RepairPolicies: the AWS provider's own list (karpenter-provider-aws v1.14.1
//     pkg/cloudprovider/cloudprovider.go), called on its CloudProvider, not copied: node repair acts on
//     AcceleratedHardwareReady=False (the GPU readiness agent's verdict) as it does on EKS.
//   - Nodes are written as a kubelet registers them: cpu, memory, pods and ephemeral storage only.
//     Device-plugin resources (nvidia.com/*, vpc.amazonaws.com/efa) appear once the device plugin runs
//     on the node (the test cluster's kubelet, tools/cluster/kubelet.py), so Karpenter's initialization
//     gate (RequestedResourcesRegistered) waits for the platform's device plugin as on EKS.
//   - Spot interruptions: the AWS provider's interruption controller (pkg/controllers/interruption)
//     with its own parser and handler, reading EventBridge messages from a spool directory instead of
//     SQS (MLPLATFORM_INTERRUPTION_SPOOL, one file per message, the queue named by INTERRUPTION_QUEUE).
//     Its handler marks the spot offering unavailable in the AWS provider's UnavailableOfferings cache,
//     which GetInstanceTypes applies to the kwok offerings, and deletes the NodeClaim (drain).
//     EC2 instance IDs are the kwok node names (kwok://NAME provider IDs).
//   - EC2 capacity: offerings listed in MLPLATFORM_CAPACITY_FILE (JSON, [{instanceType, zone, capacityType}],
//     "*" for any) are unavailable while the file lists them, as the AWS provider marks an offering after
//     CreateFleet answers InsufficientInstanceCapacity (pkg/providers/instance: MarkUnavailable on ICE).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/awslabs/operatorpkg/controller"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	awscache "github.com/aws/karpenter-provider-aws/pkg/cache"
	awscloudprovider "github.com/aws/karpenter-provider-aws/pkg/cloudprovider"
	"github.com/aws/karpenter-provider-aws/pkg/controllers/interruption"

	kwok "sigs.k8s.io/karpenter/kwok/cloudprovider"
	v1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/cloudprovider/overlay"
	"sigs.k8s.io/karpenter/pkg/controllers"
	"sigs.k8s.io/karpenter/pkg/controllers/state"
	"sigs.k8s.io/karpenter/pkg/operator"
)

const kwokProviderPrefix = "kwok://"

// CloudProvider is the kwok provider with the AWS provider's repair policies and offering cache.
type CloudProvider struct {
	*kwok.CloudProvider
	unavailable  *awscache.UnavailableOfferings
	capacityFile string
}

type exhausted struct {
	InstanceType string `json:"instanceType"`
	Zone         string `json:"zone"`
	CapacityType string `json:"capacityType"`
}

func matches(pattern, value string) bool { return pattern == "" || pattern == "*" || pattern == value }

// exhaustedOfferings reads the capacity file; a missing or unreadable file means none.
func (c *CloudProvider) exhaustedOfferings() []exhausted {
	if c.capacityFile == "" {
		return nil
	}
	raw, err := os.ReadFile(c.capacityFile)
	if err != nil {
		return nil
	}
	var out []exhausted
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil
	}
	return out
}

func (c *CloudProvider) RepairPolicies() []cloudprovider.RepairPolicy {
	return (&awscloudprovider.CloudProvider{}).RepairPolicies()
}

// GetInstanceTypes marks each offering the AWS provider's cache holds as unavailable, as the AWS
// provider's instance type provider does with the same cache.
func (c *CloudProvider) GetInstanceTypes(ctx context.Context, nodePool *v1.NodePool) ([]*cloudprovider.InstanceType, error) {
	its, err := c.CloudProvider.GetInstanceTypes(ctx, nodePool)
	if err != nil {
		return nil, err
	}
	ice := c.exhaustedOfferings()
	out := make([]*cloudprovider.InstanceType, 0, len(its))
	for _, it := range its {
		copied := it.DeepCopy()
		for _, offering := range copied.Offerings {
			if c.unavailable.IsUnavailable(ec2types.InstanceType(copied.Name), offering.Zone(), nil, offering.CapacityType()) {
				offering.Available = false
			}
			for _, e := range ice {
				if matches(e.InstanceType, copied.Name) && matches(e.Zone, offering.Zone()) &&
					matches(e.CapacityType, offering.CapacityType()) {
					offering.Available = false
				}
			}
		}
		out = append(out, copied)
	}
	return out, nil
}

// registeringClient writes a Node as the kubelet registers it: no device-plugin resources yet.
type registeringClient struct{ client.Client }

func kubeletResource(name corev1.ResourceName) bool {
	switch name {
	case corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourcePods, corev1.ResourceEphemeralStorage:
		return true
	}
	return strings.HasPrefix(string(name), corev1.ResourceHugePagesPrefix)
}

func (c registeringClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if node, ok := obj.(*corev1.Node); ok {
		for _, list := range []corev1.ResourceList{node.Status.Capacity, node.Status.Allocatable} {
			for name := range list {
				if !kubeletResource(name) {
					delete(list, name)
				}
			}
		}
	}
	return c.Client.Create(ctx, obj, opts...)
}

// spool is an SQS queue as a directory: each *.json file one message body, deleted once handled.
type spool struct{ dir, name string }

func (s *spool) Name() string { return s.name }

func (s *spool) GetSQSMessages(ctx context.Context) ([]*sqstypes.Message, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	var names []string
	for _, entry := range entries {
		if strings.HasSuffix(entry.Name(), ".json") {
			names = append(names, entry.Name())
		}
	}
	sort.Strings(names)
	var messages []*sqstypes.Message
	for _, name := range names {
		path := filepath.Join(s.dir, name)
		body, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		text, id := string(body), name
		messages = append(messages, &sqstypes.Message{Body: &text, ReceiptHandle: &path, MessageId: &id})
	}
	if len(messages) == 0 {
		// SQS long-polls (WaitTimeSeconds 20); the controller asks again at once.
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return messages, nil
}

func (s *spool) SendMessage(_ context.Context, body any) (string, error) {
	return "", fmt.Errorf("sending to the spool queue is not supported")
}

func (s *spool) DeleteSQSMessage(_ context.Context, msg *sqstypes.Message) error {
	if err := os.Remove(*msg.ReceiptHandle); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

func instanceID(providerID string) []string {
	if !strings.HasPrefix(providerID, kwokProviderPrefix) {
		return nil
	}
	return []string{strings.TrimPrefix(providerID, kwokProviderPrefix)}
}

func main() {
	ctx, op := operator.NewOperator()
	instanceTypes, err := kwok.ConstructInstanceTypes(ctx)
	if err != nil {
		log.FromContext(ctx).Error(err, "failed constructing instance types")
	}
	unavailable := awscache.NewUnavailableOfferings()
	kwokProvider := kwok.NewCloudProvider(ctx, registeringClient{op.GetClient()}, instanceTypes)
	overlayUndecoratedCloudProvider := &CloudProvider{CloudProvider: kwokProvider, unavailable: unavailable,
		capacityFile: os.Getenv("MLPLATFORM_CAPACITY_FILE")}
	cloudProvider := overlay.Decorate(overlayUndecoratedCloudProvider, op.GetClient(), op.InstanceTypeStore)
	clusterState := state.NewCluster(op.Clock, op.GetClient(), cloudProvider)
	all := controllers.NewControllers(
		ctx,
		op.Manager,
		op.Clock,
		op.GetClient(),
		op.EventRecorder,
		cloudProvider,
		overlayUndecoratedCloudProvider,
		clusterState,
		op.InstanceTypeStore,
	)
	if queue, dir := os.Getenv("INTERRUPTION_QUEUE"), os.Getenv("MLPLATFORM_INTERRUPTION_SPOOL"); queue != "" && dir != "" {
		indexer := op.Manager.GetFieldIndexer()
		if err := indexer.IndexField(ctx, &v1.NodeClaim{}, "status.instanceID", func(o client.Object) []string {
			return instanceID(o.(*v1.NodeClaim).Status.ProviderID)
		}); err != nil {
			panic(err)
		}
		if err := indexer.IndexField(ctx, &corev1.Node{}, "spec.instanceID", func(o client.Object) []string {
			return instanceID(o.(*corev1.Node).Spec.ProviderID)
		}); err != nil {
			panic(err)
		}
		all = append(all, interruption.NewController(op.GetClient(), op.Clock, cloudProvider, op.EventRecorder,
			&spool{dir: filepath.Join(dir, queue), name: queue}, nil, unavailable, nil))
	}
	op.WithControllers(ctx, all...).Start(ctx)
}

var _ controller.Controller = (*interruption.Controller)(nil)
